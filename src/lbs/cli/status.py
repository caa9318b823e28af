"""``lbs status SERVICE``: one screen of a service's state, ``--watch`` to keep it live.

A plain typer command function; the ``lbs`` app registers it (``app.command("status")(status)``,
and ``claim`` from here too: :mod:`lbs.cli.claim`). The screen is :mod:`lbs.cli.render`; exit
codes are those of :mod:`lbs.cli._common`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Annotated

import redis.asyncio as aioredis
import typer
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from .._redis.connection import resolve_client
from ..exceptions import LbsError
from ..status import ServiceStatus, collect_status, require_service
from ._common import (
    EXIT_OK,
    ServiceArgument,
    UrlOption,
    check_service,
    err_console,
    fail,
    mask_url,
    run,
)
from .claim import claim
from .render import render_status

__all__ = ["claim", "status"]


def status(
    service: ServiceArgument,
    url: UrlOption,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            "-w",
            help="Redraw every --interval seconds until Ctrl-C (exit code 0). With --json: one "
            "document per line.",
        ),
    ] = False,
    interval: Annotated[
        float,
        typer.Option(
            "--interval",
            "-n",
            min=0.1,
            metavar="SECONDS",
            help="Seconds between two reads with --watch.",
        ),
    ] = 2.0,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON document (`ServiceStatus.to_dict()`: ages and deadlines in ms of the "
            "server's clock) instead of the screen.",
        ),
    ] = False,
    letters: Annotated[
        int,
        typer.Option(
            min=0, metavar="N", help="Count the dead-letter reasons over the newest N letters."
        ),
    ] = 100,
) -> None:
    """Show a service's state: backlog, pending, consumers (alive, late, dead, departed), dead letters.

    Two round trips to the master that owns the service; every age and
    deadline is the server's clock against itself. Exit code 0 when the
    service exists, 1 when it does not (no `SERVICE-input`: the closest services there are named)
    or Redis fails.
    """
    check_service("status", service)
    if watch:
        try:
            run("status", lambda: _watch(url, service, interval, json_out, letters), url)
        except KeyboardInterrupt:
            pass
        raise typer.Exit(EXIT_OK)
    st = run("status", lambda: collect_status(url, service, letters=letters), url)
    if json_out:
        sys.stdout.write(json.dumps(st.to_dict()) + "\n")
    elif st.exists or st.delayed:  # registrations still scheduled make a service too
        Console().print(render_status(st, url=mask_url(url)))
    if not st.exists and not st.delayed:
        # Exits 1 naming the closest services there are (or all of them, or none).
        run("status", lambda: require_service(url, service), url)
        fail("status", f"no service {service!r}: {st.stream} did not exist when read")


async def _watch(url: str, service: str, interval: float, json_out: bool, letters: int) -> None:
    from rich.live import Live

    client, owned = resolve_client(url)
    console = Console()
    try:
        if json_out:
            while True:
                st = await _read_or_error(client, service, letters)
                if isinstance(st, ServiceStatus):
                    sys.stdout.write(json.dumps(st.to_dict()) + "\n")
                    sys.stdout.flush()
                else:
                    err_console.print(f"lbs status: {st}", markup=False, highlight=False)
                await asyncio.sleep(interval)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                st = await _read_or_error(client, service, letters)
                rows = max(3, console.size.height - 20)
                if isinstance(st, ServiceStatus):
                    screen = render_status(
                        st,
                        url=mask_url(url),
                        max_rows=rows,
                        footer=f"every {interval:g} s, Ctrl-C to stop",
                    )
                else:
                    screen = Panel(
                        Text(st, style="red"),
                        title=f"lbs status {service}: cannot read",
                        subtitle=time.strftime("%H:%M:%S"),
                    )
                live.update(screen, refresh=True)
                await asyncio.sleep(interval)
    finally:
        if owned:
            await client.aclose()


async def _read_or_error(
    client: aioredis.Redis | RedisCluster, service: str, letters: int
) -> ServiceStatus | str:
    """A status, or what kept it from being read (the watch goes on: Redis may come back)."""
    try:
        return await collect_status(client, service, letters=letters)
    except (LbsError, RedisError, OSError) as exc:
        return str(exc)
