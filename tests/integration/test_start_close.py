"""A close (or a SIGTERM under ``run()``) that lands while the client is still starting: the start
stops, ``run()`` returns without an error, and nothing is left behind (no instance marker that would
refuse a restart under the same consumer id until it expires, no lock, no pending entry)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs

from _helpers import client, eventually, produce

pytestmark = pytest.mark.integration


async def _left(r: aioredis.Redis, service: str) -> list[bytes]:
    stream = lbs.input_stream(service)
    found = [k async for k in r.scan_iter(match=f"{{{stream}}}:instance:*")]
    found += [k async for k in r.scan_iter(match=lbs.lock_key(service, "*"))]
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
