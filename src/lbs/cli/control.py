"""``lbs pause``, ``lbs resume``, ``lbs release``, ``lbs cancel``: an operator's hands on live work.

Plain typer command functions over :class:`lbs.ServiceControls`; the ``lbs`` app registers them
(``lbs claim --force`` is the force-claim, :mod:`lbs.cli.claim`). Each action is written to the
service's journal under ``--by`` (default ``$USER@host``). Exit codes are those of
:mod:`lbs.cli._common`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from .._keys import shard_services
from .._redis.connection import resolve_client
from .._streamids import checked_ids
from ..controls import ControlOutcome, ServiceControls, operator_name
from ..sharding import producer_wrote
from ..status import require_service
from ..status.shards import legacy_candidates
from ._common import EXIT_INCOMPLETE, ServiceArgument, UrlOption, check_service, duration, run

__all__ = ["cancel", "pause", "print_outcomes", "release", "resume"]

ByOption = Annotated[
    str,
    typer.Option(
        "--by",
        metavar="NAME",
        help="Who acts, as the journal and the logs name them (default: $USER@host).",
        show_default=False,
    ),
]
ReasonOption = Annotated[
    str,
    typer.Option("--reason", metavar="TEXT", help="Why, kept in the journal (and a dead letter)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0.0,
        metavar="SECONDS",
        help="How long to wait for each holder to act (it looks once a second).",
    ),
]


def entry_ids_checked(values: list[str]) -> list[str]:
    """An ``ENTRY_ID...`` argument's callback: the ids, each once; a usage error (exit 2) naming
    those that are not stream ids."""
    return checked_ids(values, typer.BadParameter)


EntryIds = Annotated[
    list[str],
    typer.Argument(
        metavar="ENTRY_ID...",
        help="Entry ids of held streams in the load-balancer stream, as `lbs status` shows them.",
        callback=entry_ids_checked,
        show_default=False,
    ),
]


ShardsOption = Annotated[
    int,
    typer.Option(
        "--shards",
        min=1,
        metavar="N",
        help="The service is sharded in N (the workers' --shards): every shard, and the legacy "
        "shards a producer wrote to that the workers read too.",
    ),
]
PreviousOption = Annotated[
    list[int] | None,
    typer.Option(
        "--previous-shards",
        min=1,
        metavar="M",
        help="With --shards: a shard count being left (the workers' --previous-shards; repeatable).",
        show_default=False,
    ),
]


def _targets(command: str, url: str, service: str, shards: int, previous: list[int]) -> list[str]:
    """The services a pause or resume acts on: ``service``, or with ``shards`` its shards and the
    legacy ones a producer wrote to (what the workers read); exits 1 when none of them exists."""
    if shards == 1 and not previous:
        run(command, lambda: require_service(url, service), url)
        return [service]
    run(command, lambda: require_service(url, service, shards=shards), url)
    layout = shard_services(service, shards)

    async def existing() -> list[str]:
        client, owned = resolve_client(url)
        try:
            names = [c[0] for c in legacy_candidates(service, shards, tuple(previous))]
            return [n for n in names if await producer_wrote(client, n)]
        finally:
            if owned:
                await client.aclose()

    return layout + run(command, existing, url)


def pause(
    service: ServiceArgument,
    url: UrlOption,
    reason: ReasonOption = "",
    by: ByOption = "",
    shards: ShardsOption = 1,
    previous_shards: PreviousOption = None,
    json_out: JsonOption = False,
) -> None:
    """Pause a service: its consumers take nothing new; what they hold runs on and finishes.

    Every take checks the pause, so nothing starts once this returns (a
    batch read meanwhile goes back, no retry counted); each consumer stops
    reading at its next look (a second while it holds work, five idle). New registrations, streams recovered from dead consumers and
    retries coming due wait in the load-balancer stream. `lbs resume` ends it.
    A sharded service (--shards) is paused shard by shard.
    """
    check_service("pause", service)
    targets = _targets("pause", url, service, shards, previous_shards or [])
    who = by or operator_name()

    async def act() -> dict[str, dict[str, object]]:
        out = {}
        for name in targets:
            async with ServiceControls(url, name) as controls:
                out[name] = (await controls.pause(who, reason)).to_dict()
        return out

    states = run("pause", act, url)
    if json_out:
        doc = {"service": service, "paused": states[targets[0]]}
        sys.stdout.write(json.dumps(doc | ({"shards": states} if len(targets) > 1 else {})) + "\n")
    else:
        Console().print(
            Text(f"{service} ")
            + Text("paused", style="bold yellow")
            + Text(f" by {who}" + (f": {reason}" if reason else ""))
            + Text(f" ({len(targets)} shards: {', '.join(targets)})" if len(targets) > 1 else "")
        )


def resume(
    service: ServiceArgument,
    url: UrlOption,
    by: ByOption = "",
    shards: ShardsOption = 1,
    previous_shards: PreviousOption = None,
    json_out: JsonOption = False,
) -> None:
    """Resume a paused service: its consumers take new work again within a second.

    A sharded service (--shards) is resumed shard by shard."""
    check_service("resume", service)
    targets = _targets("resume", url, service, shards, previous_shards or [])
    who = by or operator_name()

    async def act() -> tuple[dict[str, dict[str, object] | None], int]:
        out: dict[str, dict[str, object] | None] = {}
        now = 0
        for name in targets:
            async with ServiceControls(url, name) as controls:
                was = await controls.resume(who)
                out[name], now = (was.to_dict() if was else None), await controls.server_time_ms()
        return out, now

    each, now = run("resume", act, url)
    was = next((w for w in each.values() if w is not None), None)
    if json_out:
        doc = {"service": service, "was": was}
        sys.stdout.write(json.dumps(doc | ({"shards": each} if len(targets) > 1 else {})) + "\n")
    elif was is None:
        Console().print(Text(f"{service} was not paused", style="dim"))
    else:
        since = int(str(was["since_ms"]))
        Console().print(
            Text(f"{service} ")
            + Text("resumed", style="bold green")
            + Text(f" by {who} (paused by {was['by']} for {duration(now - since)})")
        )


def _order_command(action: str, doc: str) -> Callable[..., None]:
    """The command ``lbs <action>`` (release or cancel): the action asked of each held stream's
    holder, its outcomes printed; its help ``doc``."""

    def command(
        service: ServiceArgument,
        entry_ids: EntryIds,
        url: UrlOption,
        reason: ReasonOption = "",
        wait: WaitOption = 10.0,
        by: ByOption = "",
        json_out: JsonOption = False,
    ) -> None:
        check_service(action, service)
        run(action, lambda: require_service(url, service), url)
        who = by or operator_name()

        async def act() -> list[ControlOutcome]:
            async with ServiceControls(url, service) as controls:
                method = controls.release if action == "release" else controls.cancel
                return await method(entry_ids, who, reason, wait=wait)

        print_outcomes(run(action, act, url), json_out)

    command.__name__ = command.__qualname__ = action
    command.__doc__ = doc
    return command


release = _order_command(
    "release",
    """Hand held streams back now: each holder cancels the handler, no retry counted.

    The stream goes back into the load-balancer stream under a new entry id
    and is taken again (by any consumer). Exit 0 when every one was released
    or is not held; 3 when a holder did not act within --wait.
    """,
)
cancel = _order_command(
    "cancel",
    """Cancel running handlers: each holder cancels it and dead-letters the stream with the reason.

    `lbs dlq replay` brings it back. Exit 0 when every one was cancelled or
    is not held; 3 when a holder did not act within --wait.
    """,
)


def print_outcomes(results: list[ControlOutcome], json_out: bool) -> None:
    """Each outcome on a line (or one JSON array); exit 3 when some holder did not act."""
    if json_out:
        sys.stdout.write(json.dumps([r.to_dict() for r in results]) + "\n")
    else:
        console = Console()
        good = {"released", "cancelled", "force-claimed", "dead-lettered"}
        for r in results:
            style = "green" if r.outcome in good else ("dim" if r.outcome == "not held" else "red")
            detail = f"as {r.detail}" if r.outcome in ("released", "cancelled") else r.detail
            holder = f" (held by {r.holder})" if r.holder else ""
            console.print(
                Text(r.entry_id + "  ")
                + Text(r.outcome, style=style)
                + Text(f"  {detail}{holder}" if detail else holder)
            )
    if any(r.outcome in ("no answer", "not acted") for r in results):
        raise typer.Exit(EXIT_INCOMPLETE)
