"""``lbs services``: the services on a Redis (every master of a cluster), each with its backlog, held
entries, consumers and dead letters (:func:`lbs.status.service_summaries`).

Also what the other commands ask of a service's name: ``lbs worker`` warns once, before it starts a
service that is not there yet (:func:`warn_if_new`); ``lbs status``, ``lbs dlq``, ``lbs claim`` and
``lbs dashboard`` exit 1 on a name that is not there (:func:`lbs.status.require_service`, through
:func:`lbs.cli._common.run`), naming the closest existing ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import Annotated

import typer
from redis.exceptions import RedisClusterException, RedisError
from rich.console import Console
from rich.table import Table

from .._waits import within
from ..exceptions import LbsError
from ..status import ServiceSummary, require_service, service_summaries
from ..status.services import new_service_warning
from ._common import EXIT_OK, UrlOption, mask_url, run

__all__ = ["require_services", "services", "warn_if_new"]

log = logging.getLogger("lbs.worker")

#: How long ``lbs worker`` waits for the look-up before it starts anyway (it says nothing then).
LOOKUP_TIMEOUT = 10.0


def services(
    url: UrlOption,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON array, one object per service (`ServiceSummary.to_dict()`).",
        ),
    ] = False,
) -> None:
    """List the services on a Redis: each `SERVICE-input` stream (on a cluster, of every master),
    with its waiting and held entries, consumers and dead letters.

    Exit code 0 (also when there is none), 1 when Redis fails.
    """
    rows = run("services", lambda: service_summaries(url), url)
    if json_out:
        sys.stdout.write(json.dumps([r.to_dict() for r in rows]) + "\n")
        return
    console = Console()
    if not rows:
        console.print(
            f"No services on {mask_url(url)} (no stream named SERVICE-input).",
            markup=False,
            highlight=False,
        )
        return
    table = Table(
        title=f"{len(rows):,} service{'s' * (len(rows) != 1)} on {mask_url(url)}",
        title_justify="left",
        pad_edge=False,
    )
    table.add_column("service", overflow="fold")
    table.add_column("waiting", justify="right")
    table.add_column("held", justify="right")
    table.add_column("consumers", overflow="fold")
    table.add_column("dead letters", justify="right")
    if any(r.node for r in rows):
        table.add_column("node", no_wrap=True)
    for r in rows:
        cells = [r.service, *_counts(r)]
        if any(x.node for x in rows):
            cells.append(r.node)
        table.add_row(*cells)
    console.print(table)


def _counts(r: ServiceSummary) -> list[str]:
    """The waiting, held, consumers and dead-letter cells of one row (its error in their place)."""
    if r.error:
        return ["-", "-", f"cannot read: {r.error}", "-"]
    states = [f"{n} {state}" for n, state in ((r.late, "late"), (r.dead, "dead")) if n]
    return [
        f"{r.backlog:,}" + ("" if r.backlog_exact else " (est.)"),
        f"{r.pending:,}",
        ", ".join([f"{r.alive} alive", *states]),
        f"{r.dead_letters:,}",
    ]


async def require_services(url: str, services: list[str], shards: int = 1) -> None:
    """Raise :class:`lbs.NoSuchServiceError` for the first of ``services`` that is not on ``url``
    (its load-balancer stream or its dead letters; with ``shards``, any shard's)."""
    for service in services:
        await require_service(url, service, shards=shards, dead_letters=True)


def warn_if_new(url: str, service: str, shards: int = 1) -> None:
    """Log a warning (``lbs.worker``) when ``service`` does not exist on ``url`` yet: the worker
    starts it, but a mistyped name should not start a new, empty service unnoticed. Says nothing
    when the look-up fails (the worker's own start reports an unreachable Redis)."""
    try:
        message = asyncio.run(
            within(new_service_warning(url, service, shards=shards), LOOKUP_TIMEOUT)
        )
    except KeyboardInterrupt:
        log.info("stopped before the worker had started")
        raise typer.Exit(EXIT_OK) from None
    except (LbsError, RedisError, RedisClusterException, OSError, asyncio.TimeoutError) as exc:
        log.debug("could not look up the service: %s", exc)
        return
    if message:
        log.warning("%s", message, extra={"service": service})
