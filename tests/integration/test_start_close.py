"""A close (or a SIGTERM under ``run()``) that lands while the client is still starting: the start
stops, ``run()`` returns without an error, and nothing is left behind (no lease that would refuse a
restart under the same consumer id until it expires, no pending entry)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._keys import lease_prefix

from _helpers import client, eventually, produce

pytestmark = pytest.mark.integration


async def _left(r: aioredis.Redis, service: str) -> list[bytes]:
    """Leases, and entries pending to anyone."""
    found = [k async for k in r.scan_iter(match=lease_prefix(service) + "*")]
    stream = lbs.input_stream(service)
    if await r.exists(stream):
        groups = {g["name"].decode() for g in await r.xinfo_groups(stream)}
        if lbs.group_name(service) in groups:
            pending = await r.xpending_range(stream, lbs.group_name(service), "-", "+", 10)
            found += [p["message_id"] for p in pending]
    return found


async def _done(ran: list[str]) -> bool:
    return sorted(ran) == ["s1", "s2"]


async def test_a_close_at_any_point_of_the_start_leaves_nothing(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    await produce(redis_server.url, service, "s1")
    ran: list[str] = []

    async def handler(note: lbs.Notification) -> None:
        ran.append(note.stream)

    # Each round lets the start run k more event-loop steps before close(): every await of the
    # start (topology, marker, group, keyspace events, start-up recovery) is cut at some k.
    for k in range(
        1, 41
    ):  # k = 0: close() before run() began, which refuses to start a closed client
        c = client(redis_server.url, service, "w")
        task = asyncio.create_task(c.run(handler))
        for _ in range(k):
            await asyncio.sleep(0)
        await c.close()
        await asyncio.wait_for(task, 30)  # returns: a stop while starting is no error
        assert await _left(r, service) == [], f"left behind after a close at step {k}"
    # Started cleanly at last, the same consumer id is not refused; the work is done once each.
    await produce(redis_server.url, service, "s2")
    c = client(redis_server.url, service, "w")
    task = asyncio.create_task(c.run(handler))
    try:
        await eventually(lambda: _done(ran), timeout=30)
    finally:
        await c.close()
        await task
    assert sorted(ran) == ["s1", "s2"]


@pytest.mark.parametrize("keyed", [False, True], ids=["run", "run_keyed"])
async def test_a_drain_longer_than_the_lock_ttl_keeps_the_streams_held(
    redis_server: Any, r: aioredis.Redis, service: str, keyed: bool
) -> None:
    """close() while handlers run past the lease TTL: the heartbeat keeps the lease through the
    drain, so no other consumer starts them meanwhile, and their finish is a plain DONE (not a lease
    lost to the drain). The defaults' proportion: a drain twice the TTL (20 s and 10 s)."""
    url = redis_server.url
    names = [f"s{i}" for i in range(3)]
    runs: list[tuple[str, str, float, float | None]] = []  # (name, consumer, start, end)
    released: list[str] = []

    class Released:
        @lbs.hookimpl
        def lbs_lock_released(self, stream: str, status: lbs.DoneStatus, **_: Any) -> None:
            released.append(f"{stream}:{status.name}")

    def cfg(consumer: str, plugins: tuple[object, ...] = ()) -> lbs.Client:
        return client(
            url, service, consumer, plugins=plugins, lock_ttl=1.0, drain_timeout=3.0, read_block=0.1
        )

    async def work(name: str, consumer: str) -> None:
        i = len(runs)
        runs.append((name, consumer, asyncio.get_running_loop().time(), None))
        await asyncio.sleep(
            2.0 if consumer == "a" else 0.01
        )  # A's: twice the TTL, inside the drain
        runs[i] = (*runs[i][:3], asyncio.get_running_loop().time())

    def serve(c: lbs.Client, consumer: str) -> asyncio.Task[None]:
        if keyed:

            async def batch(b: lbs.KeyedBatch) -> None:
                await work(b.key, consumer)

            return asyncio.create_task(c.run_keyed(batch, handle_signals=False))

        async def one(note: lbs.Notification) -> None:
            await work(note.stream, consumer)

        return asyncio.create_task(c.run(one, handle_signals=False))

    a = cfg("a", (Released(),))
    ta = serve(a, "a")
    if keyed:
        async with lbs.Publisher(url, service) as pub:
            await pub.publish_many([(n, {"m": "1"}) for n in names])
    else:
        await produce(url, service, *names)

    async def all_started() -> bool:
        return len({n for n, c, _, _ in runs if c == "a"}) == len(names)

    await eventually(all_started, timeout=30)
    b = cfg("b")
    tb = serve(b, "b")
    try:
        await asyncio.sleep(0.3)  # B reads and recovers beside A
        await a.close()  # drains 2 s of handlers with a 1-s lease TTL
        await asyncio.wait_for(ta, 30)
        # Past a lease TTL after A's close: B would have taken a lost lease.
        await asyncio.sleep(1.5)
    finally:
        await b.close()
        await asyncio.wait_for(tb, 30)
    by_a = [(n, s, e) for n, c, s, e in runs if c == "a"]
    by_b = [n for n, c, _, _ in runs if c == "b"]
    assert all(e is not None for _, _, e in by_a), f"A's handlers were cut: {runs}"
    assert by_b == [], f"B ran streams A was draining: {runs}"
    if not keyed:  # a keyed hold commits its position instead (fenced: a lost hold moves nothing)
        assert sorted(released) == sorted(f"{n}:DONE" for n in names), released
