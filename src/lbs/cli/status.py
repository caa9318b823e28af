"""``lbs status SERVICE``: one screen of a service's state, ``--watch`` to keep it live; with
``--shards N`` a sharded service's shards (slot, master, counts; legacy shards; shards per master).

A plain typer command function; the ``lbs`` app registers it (``app.command("status")(status)``,
and ``claim`` from here too: :mod:`lbs.cli.claim`). The screen is :mod:`lbs.cli.render`; exit
codes are those of :mod:`lbs.cli._common`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import redis.asyncio as aioredis
import typer
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from .._redis.connection import resolve_client
from ..exceptions import LbsError
from ..status import ServiceStatus, ShardedStatus, collect_shards, collect_status, require_service
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
from .render import render_shards, render_status

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
    shards: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="N",
            help="The service is sharded in N (the workers' --shards): one row per shard (its hash "
            "slot, the master owning it, backlog, pending, consumers, dead letters), the legacy "
            "shards that still exist, and how many shards each master owns. --json: "
            "`ShardedStatus.to_dict()`.",
            show_default=False,
        ),
    ] = None,
    previous_shards: Annotated[
        list[int] | None,
        typer.Option(
            "--previous-shards",
            min=1,
            metavar="N",
            help="With --shards: a shard count being left (the workers' --previous-shards); its "
            "shards are listed as legacy while they exist (repeatable).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Show a service's state: backlog, pending, consumers (alive, late, dead, departed), dead letters.

    Two round trips to the master that owns the service; every age and
    deadline is the server's clock against itself. Exit code 0 when the
    service exists, 1 when it does not (no `SERVICE-input`: the closest services there are named)
    or Redis fails. With --shards: each shard read from the master owning its slot; exit code 0
    when any shard exists.
    """
    check_service("status", service)
    if shards is not None or previous_shards:
        _sharded(
            url,
            service,
            shards or 1,
            list(previous_shards or []),
            watch,
            interval,
            json_out,
            letters,
        )
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


def _sharded(
    url: str,
    service: str,
    shards: int,
    previous: list[int],
    watch: bool,
    interval: float,
    json_out: bool,
    letters: int,
) -> None:
    """``lbs status SERVICE --shards N``: every shard, the legacy ones, the shards per master."""

    async def read(client: Any) -> ShardedStatus:
        return await collect_shards(
            client, service, shards, previous_shards=previous, letters=letters
        )

    if watch:
        try:
            run("status", lambda: _watch(url, service, interval, json_out, letters, read), url)
        except KeyboardInterrupt:
            pass
        raise typer.Exit(EXIT_OK)
    sh = run("status", lambda: read(url), url)
    if json_out:
        sys.stdout.write(json.dumps(sh.to_dict()) + "\n")
    elif sh.exists:
        Console().print(render_shards(sh, url=mask_url(url)))
    if not sh.exists:
        fail("status", f"no shard of service {service!r} in {shards} shards exists")
    raise typer.Exit(EXIT_OK)


async def _watch(
    url: str,
    service: str,
    interval: float,
    json_out: bool,
    letters: int,
    read: Callable[[Any], Awaitable[ServiceStatus | ShardedStatus]] | None = None,
) -> None:
    from rich.live import Live

    client, owned = resolve_client(url)
    console = Console()
    try:
        if json_out:
            while True:
                st = await _read_or_error(client, service, letters, read)
                if isinstance(st, (ServiceStatus, ShardedStatus)):
                    sys.stdout.write(json.dumps(st.to_dict()) + "\n")
                    sys.stdout.flush()
                else:
                    err_console.print(f"lbs status: {st}", markup=False, highlight=False)
                await asyncio.sleep(interval)
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                st = await _read_or_error(client, service, letters, read)
                rows = max(3, console.size.height - 20)
                footer = f"every {interval:g} s, Ctrl-C to stop"
                screen: Any
                if isinstance(st, ShardedStatus):
                    screen = render_shards(st, url=mask_url(url), footer=footer)
                elif isinstance(st, ServiceStatus):
                    screen = render_status(st, url=mask_url(url), max_rows=rows, footer=footer)
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
    client: aioredis.Redis | RedisCluster,
    service: str,
    letters: int,
    read: Callable[[Any], Awaitable[ServiceStatus | ShardedStatus]] | None = None,
) -> ServiceStatus | ShardedStatus | str:
    """A status, or what kept it from being read (the watch goes on: Redis may come back)."""
    try:
        if read is not None:
            return await read(client)
        return await collect_status(client, service, letters=letters)
    except (LbsError, RedisError, OSError) as exc:
        return str(exc)
