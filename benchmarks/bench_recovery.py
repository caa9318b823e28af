"""Recovery's scan beside plain redis-py doing the same work, in one run.

10,000 pending entries, half of them held by a live consumer: one full pass
that tells the live from the dead and re-queues the dead half. The live half
is pending to consumer "alive", whose lease lives (and each entry has the
RFC's lock key too, which the plain scans check); the dead half is pending to
consumer "dead", whose lease is gone (and no locks). The two alternate, so
every page holds both.

* ``lbs scan``: :meth:`lbs._consumer.recovery.Recovery.scan` (XPENDING pages by cursor,
  one EXISTS round trip per page on the lease of each consumer the page's entries
  are pending to, one pipelined ``requeue-6.lua`` round trip for the page's dead
  entries: atomic, exactly once under racing recoverers);
* ``redis-py pipelines``: the RFC's steps per page with redis-py pipelines
  (XPENDING, EXISTS of each entry's lock for the page, then XACK + XRANGE, XADD,
  XDEL for the dead ones): the same round trips, but not atomic;
* ``redis-py one per round trip``: the RFC's sample code, one command per
  round trip.

Recovery latency (kill -9 to re-queued, per path) is measured by
``python -m benchmarks.recovery_latency``, and recovery at scale (one process
holding 100,000 streams killed -9: p50 / p99 / max to re-delivery, Redis CPU
per stream) by ``python -m benchmarks.recovery_scale``: scripts rather than
benchmarks, because each waits out a lease TTL.

With ``--benchmark-disable`` (``make test``): 1,000 pending entries, and each
script once, small.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._keys import lock_key

if TYPE_CHECKING:
    from .conftest import Bench

PENDING = 10_000
#: ``PENDING`` with ``--benchmark-disable`` (``make test``): still 20 pages of the scan.
SMOKE_PENDING = 1_000
PAGE = 50
#: Entry ids per XCLAIM of the set-up.
CLAIM_CHUNK = 1_000


async def _pending(bench: Bench, pending: int) -> tuple[aioredis.Redis, str]:
    """A service with ``pending`` entries pending: the even ones to consumer "alive", whose lease
    lives (each with the RFC's lock as well, for the plain scans), the odd ones to "dead", whose lease
    is gone."""
    service = bench.service("scan")
    r = bench.redis()
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    pipe = r.pipeline(transaction=False)
    for i in range(pending):
        pipe.xadd(stream, {"lbs-input": lbs.encode_input(f"s{i}")})
    ids = [i.decode() for i in await pipe.execute()]
    await r.xreadgroup(group, "dead", {stream: ">"}, count=pending)
    live = ids[::2]
    pipe = r.pipeline(transaction=False)
    for i in range(0, len(live), CLAIM_CHUNK):
        pipe.xclaim(stream, group, "alive", 0, live[i : i + CLAIM_CHUNK], justid=True)
    pipe.set(lbs.lease_key(service, "alive"), "0123456789ab", px=600_000)
    for entry_id in live:
        pipe.set(lock_key(service, entry_id), "1:alive", px=600_000)
    await pipe.execute()
    return r, service


async def scan_lbs(r: aioredis.Redis, service: str, pending: int) -> int:
    c = lbs.Client(
        r,
        service,
        "rescuer",
        lbs.Config(scan_batch=PAGE, configure_keyspace_events=False),
        load_entrypoint_plugins=False,
    )
    counts = await c.recovery.scan(min_idle=0)
    assert counts["alive"] == pending // 2
    return counts["requeued"]


async def _pending_pages(r: aioredis.Redis, stream: str, group: str) -> AsyncIterator[list[str]]:
    """Pages of pending entry ids, by exclusive cursor (as the lbs scan pages)."""
    cursor = "-"
    while True:
        page = await r.xpending_range(stream, group, min=cursor, max="+", count=PAGE, idle=0)
        ids = [p["message_id"].decode() for p in page]
        if ids:
            yield ids
        if len(ids) < PAGE:
            return
        cursor = "(" + ids[-1]


def _requeued(fields: dict[bytes, Any], entry_id: str) -> dict[bytes, Any]:
    """The fresh entry's fields: one more retry, the first delivery's id kept."""
    out = dict(fields)
    out[b"_retry_count"] = int(out.get(b"_retry_count", 0)) + 1
    out.setdefault(b"_original_id", entry_id)
    return out


async def scan_redis_py_pipelines(r: aioredis.Redis, service: str, pending: int) -> int:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    requeued = 0
    async for ids in _pending_pages(r, stream, group):
        pipe = r.pipeline(transaction=False)
        for entry_id in ids:
            pipe.exists(lock_key(service, entry_id))
        dead = [i for i, e in zip(ids, await pipe.execute()) if not e]
        pipe = r.pipeline(transaction=False)
        for entry_id in dead:
            pipe.xack(stream, group, entry_id)
            pipe.xrange(stream, entry_id, entry_id)
        replies = await pipe.execute()
        pipe = r.pipeline(transaction=False)
        for entry_id, found in zip(dead, replies[1::2]):
            pipe.xadd(stream, _requeued(found[0][1], entry_id))
            pipe.xdel(stream, entry_id)
        await pipe.execute()
        requeued += len(dead)
    return requeued


async def scan_redis_py_one_by_one(r: aioredis.Redis, service: str, pending: int) -> int:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    requeued = 0
    async for ids in _pending_pages(r, stream, group):
        for entry_id in ids:
            if await r.exists(lock_key(service, entry_id)):
                continue
            await r.xack(stream, group, entry_id)
            ((_, fields),) = await r.xrange(stream, entry_id, entry_id)
            await r.xadd(stream, _requeued(fields, entry_id))
            await r.xdel(stream, entry_id)
            requeued += 1
    return requeued


SCANS = {
    "lbs scan": scan_lbs,
    "redis-py pipelines": scan_redis_py_pipelines,
    "redis-py one per round trip": scan_redis_py_one_by_one,
}


@pytest.mark.benchmark(group=f"recovery scan, {PENDING} pending, half alive")
@pytest.mark.parametrize("impl", list(SCANS))
def bench_recovery_scan(bench: Bench, impl: str) -> None:
    bench.extra_info["baseline"] = impl == "redis-py pipelines"  # the best plain scan
    pending = bench.size(PENDING, SMOKE_PENDING)

    async def setup() -> tuple[aioredis.Redis, str, int]:
        return (*await _pending(bench, pending), pending)

    requeued = bench(SCANS[impl], setup=setup)
    assert requeued == pending // 2
    r, service, _ = bench.inputs[-1]
    stream = lbs.input_stream(service)
    # the dead half is back in the LBS as fresh entries, the live half untouched
    assert bench.run(r.xlen(stream)) == pending
    assert bench.run(r.xpending(stream, lbs.group_name(service)))["pending"] == pending // 2


def bench_recovery_latency_script_runs(loop: asyncio.AbstractEventLoop) -> None:
    """``python -m benchmarks.recovery_latency``, once and small, so the script cannot rot."""
    from .recovery_latency import main

    results = loop.run_until_complete(main(trials=1, ttl=0.5, noise=100))
    assert set(results) == {"deadline", "keyspace"}
    assert all(len(lat) == 1 and lat[0] > 0 for lat in results.values())


def bench_recovery_scale_script_runs(loop: asyncio.AbstractEventLoop) -> None:
    """``python -m benchmarks.recovery_scale``, once and small, so the script cannot rot."""
    from .recovery_scale import main

    out = loop.run_until_complete(main(streams=200, ttl=0.5, rescuers=2, quiet=True))
    assert out["back"] == 200 and out["twice"] == 0 and out["retried"] == 0
