"""``lbs claim SERVICE ENTRY_ID...``: re-queue assignments whose holder's lease is gone (it died), now.

A plain typer command function; the ``lbs`` app registers it. Exit codes are those of
:mod:`lbs.cli._common`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from .. import _keys
from .._admin import owner
from .._redis.connection import execute
from .._redis.wire import text as reply_text
from ..client import Client
from ..config import Config
from ..controls import ControlOutcome, ServiceControls, operator_name
from ..hookspecs import hookimpl
from ..status import require_service
from ._common import EXIT_INCOMPLETE, ServiceArgument, UrlOption, check_service, ping, run
from .control import ByOption, ReasonOption, entry_ids_checked, print_outcomes

__all__ = ["ClaimOutcome", "claim"]


@dataclass(frozen=True)
class ClaimOutcome:
    """What ``lbs claim`` did with one entry id."""

    entry_id: str
    #: ``requeued``, ``dead-lettered``, ``held`` (its holder's lease lives), ``not pending``, or
    #: ``not claimed`` (pending, its holder's lease gone, yet the claim did not act: a key of the wrong
    #: type, see the log).
    outcome: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"entry_id": self.entry_id, "outcome": self.outcome, "detail": self.detail}


class _Outcomes:
    """Hooks of the short-lived client: what each claim became."""

    def __init__(self) -> None:
        self.requeued: dict[str, tuple[str, int]] = {}
        self.dead: dict[str, str] = {}

    @hookimpl
    def lbs_stream_expired(self, entry_id: str, new_entry_id: str, retry_count: int) -> None:
        self.requeued[entry_id] = (new_entry_id, retry_count)

    @hookimpl
    def lbs_stream_dead_lettered(self, entry_id: str, dead_letter_id: str) -> None:
        self.dead[entry_id] = dead_letter_id


def claim(
    service: ServiceArgument,
    entry_ids: Annotated[
        list[str],
        typer.Argument(
            metavar="ENTRY_ID...",
            help="Entry ids of the load-balancer stream (`MILLISECONDS-SEQUENCE`), as "
            "`lbs status` or XPENDING show them.",
            callback=entry_ids_checked,
            show_default=False,
        ),
    ],
    url: UrlOption,
    max_retries: Annotated[
        int,
        typer.Option(
            min=-1,
            metavar="N",
            help="The service's `Config.max_retries`: an entry past it goes to the dead-letter "
            "stream instead (-1: never).",
        ),
    ] = 3,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print one JSON array of `{entry_id, outcome, detail}`.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Whatever the holder (alive but stuck): re-queue now, one retry counted, and tell "
            "the holder to drop it (its handler is cancelled when it next looks, within a second).",
        ),
    ] = False,
    reason: ReasonOption = "",
    by: ByOption = "",
) -> None:
    """Re-queue assignments now if their holder's lease is gone (it died), with one retry counted.

    The same atomic re-queue recovery does (the holder's lease must be gone: a
    live holder keeps its stream, unless --force), by a short-lived consumer
    `lbs-cli-HOST-PID` that reads nothing. Exit code 0 when every id was
    re-queued, dead-lettered or is not pending; 3 when some is still held
    (or could not be claimed); 1 when Redis fails or the service is not there.
    """
    check_service("claim", service)
    run("claim", lambda: require_service(url, service), url)  # a mistyped name: exit 1, say so
    if force:
        who = by or operator_name()

        async def forced() -> list[ControlOutcome]:
            config = Config(max_retries=max_retries)
            async with ServiceControls(url, service, config=config) as controls:
                return await controls.force_claim(entry_ids, who, reason)

        print_outcomes(run("claim", forced, url), json_out)
        return
    results = run("claim", lambda: _claim(url, service, entry_ids, max_retries), url)
    if json_out:
        sys.stdout.write(json.dumps([r.to_dict() for r in results]) + "\n")
    else:
        console = Console()
        style = {"requeued": "green", "dead-lettered": "yellow", "not pending": "dim"}
        for r in results:
            console.print(
                Text(r.entry_id + "  ")
                + Text(r.outcome, style=style.get(r.outcome, "bold red"))
                + Text(f"  {r.detail}" if r.detail else "")
            )
    if any(r.outcome in ("held", "not claimed") for r in results):
        raise typer.Exit(EXIT_INCOMPLETE)


async def _claim(
    url: str, service: str, entry_ids: list[str], max_retries: int
) -> list[ClaimOutcome]:
    await ping(url)  # an unreachable Redis is one line, not also the client's closing warning
    outcomes = _Outcomes()
    # No reader, recovery or heartbeat is ever started: the client only runs requeue-6.lua through claim().
    # retry_delay 0: what is claimed comes back at once, not parked for a delay.
    config = Config(
        recovery=False, configure_keyspace_events=False, max_retries=max_retries, retry_delay=0.0
    )
    client = Client(
        url,
        service,
        consumer_id=f"lbs-cli-{socket.gethostname()}-{os.getpid()}",
        config=config,
        plugins=[outcomes],
        load_entrypoint_plugins=False,
    )
    taken: dict[str, bool] = {}
    try:
        await client.reset_topology()  # on a cluster: route to the slot's owner (a no-op otherwise)
        for entry_id in entry_ids:
            taken[entry_id] = await client.claim(entry_id)
    finally:
        await client.close()
    # Why the others were not taken: pending to a consumer whose lease lives, or nothing pending.
    left = [i for i in entry_ids if not taken[i]]
    leases: dict[str, Any] = {}  # entry id: (holder, its lease's value or the error reading it)
    pending: dict[str, bool] = {}
    if left:
        async with owner(url, _keys.input_stream(service)) as r:
            pipe = r.pipeline(transaction=False)
            for entry_id in left:
                pipe.xpending_range(
                    _keys.input_stream(service), _keys.group_name(service), entry_id, entry_id, 1
                )
            replies = await execute(pipe, raise_on_error=False)
            holders = {}
            for entry_id, p in zip(left, replies):
                pending[entry_id] = bool(p) and not isinstance(p, Exception)
                if pending[entry_id]:
                    holders[entry_id] = reply_text(p[0]["consumer"], "replace")
            for holder in holders.values():
                pipe.get(_keys.lease_key(service, holder))
            values = await execute(pipe, raise_on_error=False) if holders else []
        for (entry_id, holder), value in zip(holders.items(), values):
            leases[entry_id] = (holder, value)
    out = []
    for entry_id in entry_ids:
        if entry_id in outcomes.requeued:
            new_id, retries = outcomes.requeued[entry_id]
            out.append(ClaimOutcome(entry_id, "requeued", f"as {new_id} (retry {retries})"))
        elif entry_id in outcomes.dead:
            out.append(
                ClaimOutcome(
                    entry_id,
                    "dead-lettered",
                    f"as {outcomes.dead[entry_id]} (past --max-retries {max_retries})",
                )
            )
        elif taken[entry_id]:
            out.append(ClaimOutcome(entry_id, "requeued", ""))
        elif entry_id in leases and isinstance(leases[entry_id][1], Exception):
            holder, err = leases[entry_id]
            out.append(ClaimOutcome(entry_id, "not claimed", f"{holder}'s lease key: {err}"))
        elif entry_id in leases and leases[entry_id][1] is not None:
            holder, value = leases[entry_id]
            out.append(
                ClaimOutcome(
                    entry_id,
                    "held",
                    f"by {holder} (instance {reply_text(value, 'replace')}, its lease lives)",
                )
            )
        elif not pending.get(entry_id):
            out.append(
                ClaimOutcome(
                    entry_id, "not pending", "finished, recovered already, or never delivered"
                )
            )
        else:
            out.append(
                ClaimOutcome(
                    entry_id, "not claimed", "pending without a lease, yet refused (see the log)"
                )
            )
    return out
