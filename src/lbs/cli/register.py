"""``lbs register``: register one data stream from the command line, now or scheduled.

``lbs register SERVICE NAME [--info JSON] [--in DURATION | --at TIME]``: what
:meth:`lbs.Producer.add_stream` does (``delay=``, ``at=``). A service that does not exist yet is
created (producers create services), as ``lbs worker`` does. Exit code 0 when registered (or
parked), 1 when Redis fails, 2 for a wrong command line (a bad ``--info``, ``--in`` or ``--at``,
both of these, a name a consumer would dead-letter), 78 for a bad URL.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from ..exceptions import ConfigurationError, InvalidInputError
from ..producer import Producer, encode_input
from ._common import EXIT_USAGE, ServiceArgument, UrlOption, check_service, fail, run

__all__ = ["parse_at", "parse_duration", "register"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|min|s|m|h|d)")


def parse_duration(value: str) -> timedelta:
    """``90`` (seconds), ``1.5s``, ``250ms``, ``10m`` (or ``10min``), ``2h``, ``1d``, ``1h30m``; a
    ConfigurationError for anything else (a negative one too)."""
    v = value.strip().lower()
    try:
        seconds = float(v)
    except ValueError:
        parts = _PART.findall(v)
        if not parts or "".join(n + u for n, u in parts) != v:
            seconds = math.nan
        else:
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(
            f"--in takes a duration such as 90 (seconds), 250ms, 1.5s, 10m, 2h, 1d or 1h30m; got {value!r}"
        )
    return timedelta(seconds=seconds)


def parse_at(value: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 date and time (``2030-01-02T09:00:00+01:00``; without a zone: this machine's local
    time), or ``HH:MM[:SS]``: the next such local time (today, else tomorrow)."""
    now = now or datetime.now().astimezone()
    v = value.strip()
    if re.fullmatch(r"\d{1,2}:\d{2}(:\d{2})?", v):
        h, m, *s = (int(x) for x in v.split(":"))
        try:
            when = now.replace(hour=h, minute=m, second=s[0] if s else 0, microsecond=0)
        except ValueError:
            raise ConfigurationError(f"--at {value!r} is not a time of day") from None
        return when if when > now else when + timedelta(days=1)
    try:
        when = datetime.fromisoformat(v)
    except ValueError:
        raise ConfigurationError(
            f"--at takes an ISO 8601 date and time (2030-01-02T09:00+01:00) or HH:MM; got {value!r}"
        ) from None
    return when if when.tzinfo is not None else when.astimezone()


def register(
    service: ServiceArgument,
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="The data stream's name.", show_default=False)
    ],
    url: UrlOption,
    info: Annotated[
        str,
        typer.Option(
            "--info",
            metavar="JSON",
            help="The registration's Info: a JSON object.",
            show_default=False,
        ),
    ] = "",
    in_: Annotated[
        str,
        typer.Option(
            "--in",
            metavar="DURATION",
            help="Register it this much later (Redis's clock): 90, 250ms, 10m, 2h, 1h30m.",
            show_default=False,
        ),
    ] = "",
    at: Annotated[
        str,
        typer.Option(
            "--at",
            metavar="TIME",
            help="Register it at this time: ISO 8601 (2030-01-02T09:00+01:00; no zone: local time) "
            "or HH:MM (the next one). A time already past registers it now.",
            show_default=False,
        ),
    ] = "",
) -> None:
    """Register data stream NAME in SERVICE's load-balancer stream, now or later (--in, --at).

    A scheduled one is parked in Redis (`{SERVICE-input}:delayed`, shown by `lbs status`) and any
    running consumer moves it into the load-balancer stream within a second of its time.
    Prints the entry id (the parked id when scheduled). Exit code 0, 1 when Redis fails, 2 for a
    wrong command line.
    """
    check_service("register", service)
    try:
        parsed: Any = json.loads(info) if info else None
        if parsed is not None and not isinstance(parsed, dict):
            raise ConfigurationError(f"--info must be a JSON object, got {info!r:.100}")
        if in_ and at:
            raise ConfigurationError("give --in or --at, not both")
        delay = parse_duration(in_) if in_ else None
        when = parse_at(at) if at else None
        encode_input(name, parsed)  # what a consumer would dead-letter: a usage error
    except json.JSONDecodeError as exc:
        fail("register", f"--info is not JSON: {exc}", EXIT_USAGE)
    except (ConfigurationError, InvalidInputError) as exc:
        fail("register", str(exc), EXIT_USAGE)

    async def work() -> str:
        async with Producer(url, service, load_entrypoint_plugins=False) as producer:
            return await producer.add_stream(name, parsed, delay=delay, at=when)

    entry_id = run("register", work, url)
    if delay:
        typer.echo(f"{entry_id}\t{name} parked in {{{service}-input}}:delayed, due in {in_}")
    elif when is not None and when > datetime.now().astimezone():
        typer.echo(
            f"{entry_id}\t{name} parked in {{{service}-input}}:delayed, due at {when.isoformat()}"
        )
    else:
        typer.echo(f"{entry_id}\t{name} in {service}-input")
