"""The demo's keyed scenario: support tickets whose events must be handled one by one, in order.

1. An :class:`lbs.Publisher` publishes the events of four tickets,
   interleaved (opened, replied, escalated, ...): each goes to its ticket's
   data stream, and each ticket is registered in the LBS once.
2. ``desk-x``, a consumer in another process (``python -m lbs._demo_keyed
   doomed URL SERVICE``), takes tickets and handles their events; it is killed
   with SIGKILL in the middle of a ticket, after committing part of it.
3. ``desk-b`` (here) takes over once the dead desk's lease has expired and
   finishes every ticket after its committed position.
4. Each handled event writes one line to the ticket's timeline stream with
   ``KeyedBatch.emit`` (written by the fenced commit, so once); the demo reads the
   timelines back and checks every ticket's events are there once each, in
   order, whoever handled them.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from . import _keys
from ._demo_crash import kill_after_first_line
from ._redis.connection import open_plain
from .client import Client
from .config import Config
from .keyed import KeyedBatch, KeyedHandler
from .publisher import Publisher

Printer = Callable[[str], None]

TICKETS = 4
EVENTS = ("opened", "replied", "escalated", "replied", "solved", "closed")
#: The killed desk's lease TTL (``Config.lock_ttl``): how long its tickets stay held after SIGKILL.
LOCK_TTL = 1.0


@dataclass
class KeyedResult:
    #: Per ticket, the events in its timeline, in order, and who handled each.
    timelines: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    #: Tickets desk-x had committed part of when it was killed.
    cut_mid_ticket: int = 0

    @property
    def ok(self) -> bool:
        return (
            len(self.timelines) == TICKETS
            and all([e for e, _ in t] == list(EVENTS) for t in self.timelines.values())
            and self.cut_mid_ticket > 0
        )


def keyed_service(service: str) -> str:
    """The scenario's service when the demo runs as ``service``: ``<service>-tickets``.

    Every key the scenario writes is under it: its LBS, its keys' streams and
    state, the timeline, all under the hash tag ``{<service>-tickets-input}``.
    """
    return f"{service}-tickets"


def _timeline(service: str) -> str:
    return _keys.hash_tag(service) + ":timeline"


def _handler(service: str, desk: str, slow: float) -> KeyedHandler:
    async def handle(batch: KeyedBatch) -> None:
        for m in batch.messages:
            batch.emit(
                _timeline(service),
                {"ticket": batch.key, "event": m.fields["event"], "desk": desk},
                m,
            )
        await asyncio.sleep(slow)  # the desk's work

    return handle


async def run_keyed_demo(url: str, service: str, out: Printer = print) -> KeyedResult:
    """Run the scenario against the Redis at ``url``; return what the timelines say."""
    result = KeyedResult()
    r = open_plain(url)
    names = [f"ticket-{i + 1}" for i in range(TICKETS)]
    try:
        await _publish(r, service, names, out)
        killed_at = await _kill_desk_x(r, url, service, names, result, out)
        await _take_over(r, service, killed_at, out)
        await _read_timelines(r, service, names, result, out)
        await r.delete(
            _timeline(service),
            _keys.dead_letter_stream(service),
            _keys.input_stream(service),
            _keys.fence_key(service),
        )
    finally:
        await r.aclose()
    return result


async def _publish(r: aioredis.Redis, service: str, names: list[str], out: Printer) -> None:
    """Step 1: every ticket's events, interleaved, published by key."""
    async with Publisher(r, service) as pub:
        await pub.publish_many([(t, {"event": e}) for e in EVENTS for t in names])
    out(
        f"tickets: published {len(EVENTS)} events of each of {TICKETS} tickets, interleaved; "
        f"{await r.xlen(_keys.input_stream(service))} tickets registered in {_keys.input_stream(service)}"
    )


async def _kill_desk_x(
    r: aioredis.Redis, url: str, service: str, names: list[str], result: KeyedResult, out: Printer
) -> float:
    """Step 2: desk-x, in another process, commits part of a ticket and is killed; when it was."""
    line, pid, killed_at = await kill_after_first_line(
        "desk-x exited with {} before committing anything",
        "lbs._demo_keyed",
        "doomed",
        url,
        service,
    )
    positions = {t: await r.hget(_keys.key_state(service, t), "pos") for t in names}
    result.cut_mid_ticket = sum(1 for p in positions.values() if p)
    out(
        f"tickets: desk-x (pid {pid}) committed part of {result.cut_mid_ticket} ticket(s) "
        f"({json.loads(line)['committed']} events) and was killed with SIGKILL mid-ticket"
    )
    return killed_at


async def _take_over(r: aioredis.Redis, service: str, killed_at: float, out: Printer) -> None:
    """Step 3: desk-b finishes every ticket once desk-x's lease expired, each after its position."""
    b = Client(
        r,
        service,
        consumer_id="desk-b",
        load_entrypoint_plugins=False,
        config=Config(lock_ttl=10.0, read_block=0.1, deadline_poll_interval=0.1),
    )
    runner = asyncio.create_task(b.run_keyed(_handler(service, "desk-b", 0.0), batch=2))
    try:
        deadline = time.monotonic() + 30
        while b.stats.done < TICKETS:
            if time.monotonic() > deadline:
                raise RuntimeError("desk-b did not finish the tickets in 30 s")
            await asyncio.sleep(0.02)
    finally:
        await b.close()
        await runner
    out(
        f"tickets: desk-b took over once desk-x's lease expired and finished all {TICKETS} tickets "
        f"{time.perf_counter() - killed_at:.2f} s after the kill, each after its committed position"
    )


async def _read_timelines(
    r: aioredis.Redis, service: str, names: list[str], result: KeyedResult, out: Printer
) -> None:
    """Step 4: the timelines read back: every ticket's events once each, in order, whoever handled them."""
    timeline: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(_timeline(service))  # type: ignore[assignment]
    for _, f in timeline:
        ticket = f[b"ticket"].decode()
        result.timelines.setdefault(ticket, []).append((f[b"event"].decode(), f[b"desk"].decode()))
    for t in names:
        steps = " > ".join(f"{e} ({d})" for e, d in result.timelines.get(t, []))
        out(f"tickets: {t}: {steps}")
    verdict = "in order, once each" if result.ok else "NOT in order once each"
    out(f"tickets: every ticket's events {verdict}, across the kill")


async def _doomed(url: str, service: str) -> None:
    """desk-x: handles tickets slowly, says how much it committed once a ticket is part-way, then waits to die."""
    c = Client(
        url,
        service,
        consumer_id="desk-x",
        load_entrypoint_plugins=False,
        config=Config(lock_ttl=LOCK_TTL, read_block=0.1),
    )
    runner = asyncio.create_task(
        c.run_keyed(_handler(service, "desk-x", 0.5), batch=2, handle_signals=False)
    )
    async with open_plain(url) as r:
        states = [_keys.key_state(service, f"ticket-{i + 1}") for i in range(TICKETS)]
        deadline = time.monotonic() + 30
        # Until a commit has landed (its batch's effects with it); the next batches are under way.
        while (
            not any([await r.hexists(state, "pos") for state in states])
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.01)
    print(json.dumps({"committed": c.stats.keyed_messages, "pid": os.getpid()}), flush=True)
    await runner


if __name__ == "__main__":  # pragma: no cover - run as the demo's child process
    if sys.argv[1] == "doomed":
        asyncio.run(_doomed(sys.argv[2], sys.argv[3]))
