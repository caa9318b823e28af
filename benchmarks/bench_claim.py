"""Recovery through the CLAIM reader beside the XPENDING scan, in one run (Redis >= 8.4).

20,000 assignments pending, every one idle past the threshold: 19,000 held by
a live consumer (pending to it, its lease alive; the heartbeat extends the
lease only, so their idle time grows), then 1,000 delivered to a consumer that
stopped (its lease gone). Timed end to end, from a fresh consumer's
``start()`` until the 1,000 have been delivered to it again:

* ``claim reader``: ``lbs-claim``'s XREADGROUP ... CLAIM (one read claims the
  idle entries, with their delivery counts). Skipped: the reader no longer
  makes CLAIM reads (issue 44);
* ``scan``: the default reader with the scan at start (XPENDING IDLE pages,
  an EXISTS round trip per page on the leases of the page's consumers,
  ``requeue-6.lua`` for the dead ones, which the reader then reads as fresh
  entries).

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
MIN_IDLE = 2.0  # the threshold (above twice lock_ttl 0.5 s); every entry is idle past it
CHUNK = 1_000


async def _pending(bench: Bench, live: int, dead: int) -> tuple[aioredis.Redis, str, int]:
    service = bench.service("claim")
    r = bench.redis()
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    async with lbs.Producer(r, service) as p:
        for i in range(0, live + dead, CHUNK):
            await p.add_streams([f"s{j}" for j in range(i, min(live + dead, i + CHUNK))])
    # The live holder's first, so recovery looks past all of them (idle too) before it finds the dead.
    await r.xreadgroup(group, "alive", {stream: ">"}, count=live)
    await r.xreadgroup(group, "stopped", {stream: ">"}, count=dead)
    await r.set(lbs.lease_key(service, "alive"), "0123456789ab", px=600_000)  # the live holder's
    await asyncio.sleep(MIN_IDLE + 0.1)  # every entry is now idle past the threshold
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
#: Rows not run, and why.
SKIPPED = {"claim reader": "issue 44: CLAIM reads are being redesigned for the lease"}


@pytest.mark.benchmark(group=f"recover {DEAD} idle among {LIVE + DEAD} pending, end to end")
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.skip(reason=SKIPPED[p])) if p in SKIPPED else p
        for p in PATHS
    ],
)
def bench_recover_idle(bench: Bench, path: str) -> None:
    live, dead = bench.size(LIVE, LIVE // SMOKE_DIVISOR), bench.size(DEAD, DEAD // SMOKE_DIVISOR)
    notes = bench(PATHS[path], setup=lambda: _pending(bench, live, dead))
    assert all(n.retry_count == 1 for n in notes)
    # the stopped consumer's streams (registered after the live holder's), each once
    assert sorted(n.stream for n in notes) == sorted(f"s{j}" for j in range(live, live + dead))
    r, service, _ = bench.inputs[-1]
    pending = bench.run(r.xpending(lbs.input_stream(service), lbs.group_name(service)))
    by_consumer = {c["name"].decode(): c["pending"] for c in pending["consumers"]}
    assert by_consumer.get("alive") == live  # the live holder kept every one of its entries
