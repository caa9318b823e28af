"""What every ``lbs`` command shares: exit codes, the stderr console, errors, logging, URL masking,
the ``--url`` option and ``SERVICE`` argument of the commands that read a service, running their
work, and durations for people.

Exit codes of ``status``, ``claim`` and ``dlq``:

* 0: done as asked (``status``: the service exists; ``claim``: every id was
  re-queued, dead-lettered, or needed nothing: not pending);
* 1: a failure: Redis unreachable or refusing (a key of the wrong type, an
  ACL), or no such service (``status``: its load-balancer stream does not
  exist; ``--json`` still prints the document, with ``"exists": false``);
* 2: the command line is wrong;
* 3: done in part (``claim``: some assignment is still held by a live
  holder, its lease alive, or could not be claimed; ``dlq``: letters refused, not found, or a
  purge not confirmed);
* 78: a setting is invalid (a Redis URL redis-py cannot use).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import sys
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rich.console import Console
from rich.markup import escape

from .. import _keys
from .._urlmask import mask_url
from ..exceptions import ConfigurationError, LbsError

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "EXIT_INCOMPLETE",
    "EXIT_OK",
    "EXIT_USAGE",
    "ServiceArgument",
    "UrlOption",
    "check_service",
    "duration",
    "err_console",
    "explain",
    "fail",
    "mask_url",
    "ping",
    "run",
    "setup_logging",
]

#: A clean stop: the work ended, or a signal's drain and hand-back finished.
EXIT_OK = 0
#: A failure at run time: Redis unreachable, a refused start, an lbs error.
EXIT_FAILURE = 1
#: The command line itself is wrong (click's usage errors, a bad MODULE:HANDLER).
EXIT_USAGE = 2
#: A setting is invalid, wherever it came from (a file, LBS_<FIELD>, --set, a flag): sysexits' EX_CONFIG.
EXIT_CONFIG = 78

#: The command ran but did not do all it was asked: a stream still held, a letter refused or missing.
EXIT_INCOMPLETE = 3

#: Messages, banners and logs go to stderr; stdout carries only what a command is asked to print.
err_console = Console(stderr=True)


def fail(command: str, message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print ``lbs <command>: error: <message>`` to stderr and exit with ``code`` (no traceback)."""
    err_console.print(
        f"[bold red]lbs {command}: error:[/] {escape(message)}", highlight=False, soft_wrap=True
    )
    raise typer.Exit(code)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps (``lbs.RedisOperationError.cause``, ``__cause__``, ``__context__``)."""
    out: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in out and len(out) < 8:
        out.append(seen)
        seen = getattr(seen, "cause", None) or seen.__cause__ or seen.__context__
    return out


def explain(exc: BaseException, url: str = "") -> str:
    """``exc`` as one line, with the fix when the URL made the usual mistakes: no password (redis-py
    says "HELLO must be called..."), a wrong one, TLS (``rediss://``) against a plain port (a timeout)
    or a plain URL against a TLS port (the server hangs up)."""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain)
    tls = url.lower().startswith("rediss")
    shown = mask_url(url) if url else "the URL"
    if (
        any(isinstance(e, AuthenticationError) for e in chain)
        or "NOAUTH" in text
        or "WRONGPASS" in text
    ):
        if "HELLO must be called" in text or "NOAUTH" in text or "Authentication required" in text:
            return (
                f"the server wants a password and {shown} has none: put it in the URL, "
                "redis://:PASSWORD@HOST:PORT (an ACL user: redis://USER:PASSWORD@HOST:PORT)"
            )
        return (
            f"the server refused the user or password of {shown} (WRONGPASS): check them "
            "(redis://USER:PASSWORD@HOST:PORT)"
        )
    if any(isinstance(e, ssl.SSLError) for e in chain) or (
        tls and any(isinstance(e, (RedisTimeoutError, TimeoutError)) for e in chain)
    ):
        return (
            f"no TLS handshake with {shown} ({exc}): if the server does not speak TLS on that port, use "
            "redis:// (rediss:// is for TLS; a CA of your own goes in ?ssl_ca_certs=PATH)"
        )
    if (
        not tls
        and url
        and any(isinstance(e, RedisConnectionError) for e in chain)
        and ("closed by server" in text or "Connection reset" in text)
    ):
        return f"{exc} (if the server speaks TLS on that port, use rediss://)"
    why = _unreachable(chain)
    if why is not None:
        return (
            f"cannot connect to Redis at {shown} ({why}): is Redis running there? "
            "Give its URL with --url (or the LBS_URL environment variable)"
        )
    return str(exc)


def _unreachable(chain: list[BaseException]) -> str | None:
    """Why no connection could be made (``connection refused``, ``host not found``, ...), or None
    when ``chain`` is about something else (a dropped connection, a reply)."""
    for e in chain:
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, socket.gaierror):
            return f"host not found: {e.strerror or e}"
    for e in chain:
        said = str(e)
        if isinstance(e, RedisTimeoutError) and "connecting" in said.lower():
            return "timed out connecting"
        if isinstance(e, RedisConnectionError) and " connecting to " in said:
            # "Error 113 connecting to HOST:PORT. No route to host.": what follows the address
            return said.partition(". ")[2].rstrip(".") or said
    return None


def setup_logging(level: str, fmt: str = "text") -> None:
    """Log records to stderr: ``json``, one JSON object per line (:mod:`lbs.logs`); ``text``, through rich
    on a terminal, one plain line per record otherwise (a service's log)."""
    handler: logging.Handler
    if fmt == "json":
        from ..logs import configure

        configure(level, "json")
        return
    if err_console.is_terminal:
        from rich.logging import RichHandler

        handler = RichHandler(console=err_console, show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


#: ``--url``: every command that reads a service takes it, defaulting to ``$LBS_URL``.
UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="LBS_URL",
        show_envvar=True,
        help="Redis URL: redis://, rediss://, redis+cluster:// (any node of a cluster), rediss+cluster://, "
        "or redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE_NAME[/DB] (rediss+sentinel://).",
    ),
]
ServiceArgument = Annotated[
    str,
    typer.Argument(
        metavar="SERVICE",
        help="The service: its load-balancer stream is `SERVICE-input`.",
        show_default=False,
    ),
]

T = TypeVar("T")


def run(command: str, work: Callable[[], Coroutine[Any, Any, T]], url: str = "") -> T:
    """Run ``work()`` to its end; lbs and Redis errors become a message on stderr and an exit code.

    A bad setting (a URL redis-py cannot use, a service name with braces)
    exits 78, any other lbs or Redis error 1 (with the fix, for a password
    or TLS mistake in ``url`` or a Redis it cannot connect to). Ctrl-C is not caught here.
    """
    try:
        return asyncio.run(work())
    except ConfigurationError as exc:
        fail(command, str(exc), EXIT_CONFIG)
    except (LbsError, RedisError, RedisClusterException, OSError) as exc:
        fail(command, explain(exc, url), EXIT_FAILURE)


async def ping(url: str) -> None:
    """PING Redis at ``url``: a command checks it can connect before it starts anything that logs
    (what connecting raised is :func:`explain`'s to put in one line)."""
    from .._redis.connection import resolve_client

    client, _ = resolve_client(url)
    try:
        await client.ping()
    finally:
        await client.aclose()


def check_service(command: str, service: str) -> None:
    """Exit 2 (usage), naming the problem, unless ``service`` can name a service."""
    try:
        _keys.validate_service(service)
    except ConfigurationError as exc:
        fail(command, str(exc), EXIT_USAGE)


def duration(ms: int | None, signed: bool = False) -> str:
    """A duration for people: ``850 ms``, ``12.3 s``, ``4 min``, ``2.5 h``, ``3.1 d``; ``-`` for None."""
    if ms is None:
        return "-"
    sign = ("+" if ms >= 0 else "-") if signed else ("-" if ms < 0 else "")
    a = abs(ms)
    if a < 1000:
        text = f"{a} ms"
    elif a < 60_000:
        text = f"{a / 1000:.1f} s"
    elif a < 3_600_000:
        text = f"{a / 60_000:.0f} min"
    elif a < 86_400_000:
        text = f"{a / 3_600_000:.1f} h"
    else:
        text = f"{a / 86_400_000:.1f} d"
    return sign + text
