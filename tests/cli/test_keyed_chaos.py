"""Keyed processing under chaos: worker processes killed (SIGKILL) and stalled past their TTL
(SIGSTOP), a publisher running throughout; the effects audited per key (written by the fenced commit)."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys

from _cli_helpers import HANDLERS, eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

KEYS, PER_KEY = 40, 25


async def test_killed_and_stalled_holders_lose_reorder_and_duplicate_nothing(
    any_server: Any, service: str, start_worker: Any
) -> None:
    """On Redis 8.x and on 7.0: the effects are written by the fenced commit on both."""
    redis_server = any_server
    r = aioredis.Redis.from_url(any_server.url)
    out = _keys.hash_tag(service) + ":out"
    # At most 10 keys a worker: all three hold keys when the chaos starts.
    common = (
        "--service",
        service,
        "--url",
        redis_server.url,
        "--lock-ttl",
        "1",
        "--batch",
        "3",
        "--concurrency",
        "10",
        "--set",
        "read_block=0.1",
        "--set",
        "deadline_poll_interval=0.1",
    )
    workers = [
        start_worker(f"{HANDLERS}:keyed", "--consumer-id", f"w{i}", *common) for i in range(3)
    ]
    messages = [(f"key-{k}", {"n": i}) for i in range(PER_KEY) for k in range(KEYS)]

    async def effects() -> list[tuple[str, int]]:
        return [(f[b"key"].decode(), int(f[b"n"])) for _, f in await r.xrange(out)]

    async def all_up() -> bool:  # each worker is reading before any message is published
        return all(
            [await r.get(_keys.lease_key(service, f"redis-consumer-w{i}")) for i in range(3)]
        )

    await eventually(all_up, "the workers running")
    async with lbs.Publisher(r, service) as pub:
        half = len(messages) // 2
        for at in range(0, half, 20):
            await pub.publish_many(messages[at : at + 20])
            await asyncio.sleep(0.01)

        async def all_working() -> bool:  # every worker has written effects: each holds keys
            return len({f[b"pid"] for _, f in await r.xrange(out)}) == len(workers)

        await eventually(all_working, "all three workers processing")
        workers[0].signal(signal.SIGKILL)  # dies holding keys
        workers[1].signal(signal.SIGSTOP)  # stalls past its lock TTL, then comes back
        for at in range(half, len(messages), 20):
            await pub.publish_many(messages[at : at + 20])
            await asyncio.sleep(0.01)
        await asyncio.sleep(2.5)
        workers[1].signal(signal.SIGCONT)
        workers.append(start_worker(f"{HANDLERS}:keyed", "--consumer-id", "w3", *common))

    async def all_done() -> bool:
        return (
            len(set(await effects())) == KEYS * PER_KEY
            and await r.xlen(lbs.input_stream(service)) == 0
        )

    await eventually(all_done, "every message's effect written, every key let go", timeout=120)
    got = await effects()
    per_key: dict[str, list[int]] = defaultdict(list)
    for key, n in got:
        per_key[key].append(n)
    assert {
        k: v for k, v in per_key.items() if v != list(range(PER_KEY))
    } == {}  # in order, none lost or twice
    assert len(got) == KEYS * PER_KEY
    pids: dict[bytes, set[bytes]] = defaultdict(set)
    for _, f in await r.xrange(out):
        pids[f[b"key"]].add(f[b"pid"])
    assert any(len(p) > 1 for p in pids.values()), (
        "no key changed holders mid-way: the chaos missed"
    )

    async def inside_run() -> (
        bool
    ):  # a worker takes SIGTERM as a drain only once run_keyed() routes it
        return all(
            [await r.get(_keys.lease_key(service, f"redis-consumer-{w}")) for w in ("w1", "w3")]
        )

    await eventually(inside_run, "the live workers running")
    for w in workers[1:]:
        w.signal(signal.SIGTERM)
    for w in workers[1:]:
        assert await w.wait() == 0, w.err()
    left = [k async for k in r.scan_iter(match=f"*{_keys.hash_tag(service)}:[km]:*")]
    await r.aclose()
    assert left == []
