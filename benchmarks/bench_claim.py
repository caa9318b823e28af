"""Recovery through the CLAIM reader beside the XPENDING scan, in one run (Redis >= 8.4).

20,000 assignments pending: 19,000 held by a live consumer (locked, idle time
just refreshed, as lbs's heartbeat keeps it) and 1,000 delivered to a
consumer that stopped (no locks, idle past the threshold). Timed end to end,
from a fresh consumer's ``start()`` until the 1,000 have been delivered to it
again:

* ``claim reader``: ``lbs-claim``'s XREADGROUP ... CLAIM (one read claims and
  locks the idle entries, with their delivery counts);
* ``scan``: the default reader with the scan at start (XPENDING IDLE pages,
  an EXISTS round trip per page, ``requeue-6.lua`` for the dead ones, which
  the reader then reads as fresh entries).

With ``--benchmark-disable`` (``make test``): a tenth of each, once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs_claim import ClaimReader

if TYPE_CHECKING:
    from .conftest import Bench

LIVE, DEAD = 19_000, 1_000
#: Divides ``LIVE`` and ``DEAD`` with ``--benchmark-disable`` (``make test``).
SMOKE_DIVISOR = 10
MIN_IDLE = 2.0  # the threshold; lock_ttl 0.5 s keeps live entries far below it
CHUNK = 1_000


async def _pending(bench: Bench, live: int, dead: int) -> tuple[aioredis.Redis, str, int]:
    service = bench.service("claim")
    r = bench.redis()
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    async with lbs.Producer(r, service) as p:
        for i in range(0, live + dead, CHUNK):
            await p.add_streams([f"s{j}" for j in range(i, min(live + dead, i + CHUNK))])
    await r.xreadgroup(group, "stopped", {stream: ">"}, count=dead)
    read = await r.xreadgroup(group, "alive", {stream: ">"}, count=live)
    live_ids = [e[0] for e in (read[stream.encode()][0] if isinstance(read, dict) else read[0][1])]
    pipe = r.pipeline(transaction=False)
    for entry_id in live_ids:
        pipe.set(lbs.lock_key(service, entry_id.decode()), "1:alive", px=600_000)
    await pipe.execute()
    await asyncio.sleep(MIN_IDLE + 0.1)  # every entry is now idle past the threshold...
    for i in range(0, live, CHUNK):  # ...and the live holder's heartbeat refreshes its own
        await r.xclaim(stream, group, "alive", 0, live_ids[i : i + CHUNK], justid=True)
    return r, service, dead


def _config(**kw: Any) -> lbs.Config:
    return lbs.Config(
        read_block=0.05,
        lock_ttl=0.5,
        min_idle=MIN_IDLE,
        max_streams=2 * CHUNK,
        read_count=CHUNK,
        configure_keyspace_events=False,
        keyspace_recovery=False,
        **kw,
    )


async def _delivered(c: lbs.Client, n: int) -> list[lbs.Notification]:
    out: list[lbs.Notification] = []
    async for note in c.notifications():
        if note.type is lbs.NotificationType.STREAM_ADDED:
            out.append(note)
            if len(out) == n:
                break
    return out


async def recover_claim(r: aioredis.Redis, service: str, dead: int) -> list[lbs.Notification]:
    c = lbs.Client(
        r,
        service,
        "rescuer",
        _config(recovery=False),
        plugins=[ClaimReader()],
        load_entrypoint_plugins=False,
    )
    await c.start()
    try:
        return await _delivered(c, dead)
    finally:
        await c.close()


async def recover_scan(r: aioredis.Redis, service: str, dead: int) -> list[lbs.Notification]:
    c = lbs.Client(r, service, "rescuer", _config(), load_entrypoint_plugins=False)
    await c.start()
    try:
        return await _delivered(c, dead)
    finally:
        await c.close()


PATHS = {"claim reader": recover_claim, "scan": recover_scan}


@pytest.mark.benchmark(group=f"recover {DEAD} idle among {LIVE + DEAD} pending, end to end")
@pytest.mark.parametrize("path", list(PATHS))
def bench_recover_idle(bench: Bench, path: str) -> None:
    live, dead = bench.size(LIVE, LIVE // SMOKE_DIVISOR), bench.size(DEAD, DEAD // SMOKE_DIVISOR)
    notes = bench(PATHS[path], setup=lambda: _pending(bench, live, dead))
    assert len(notes) == dead and all(n.retry_count == 1 for n in notes)
    r, service, _ = bench.inputs[-1]
    pending = bench.run(
        r.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), "-", "+", 10, consumername="alive"
        )
    )
    assert len(pending) == 10  # the live holder kept its entries
