"""Fair dispatch (``Config.fair_dispatch``, read-3.lua's ARGV[13]): while peers of the group are live,
a read takes no more than the reading consumer's share of the work, so a few long registrations
spread over idle consumers instead of going to the first that reads."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._keys import (
    consumers_key,
    fence_key,
    group_name,
    input_stream,
    instance_key,
    key_prefix,
    lock_key,
)
from lbs._redis.scripts import source

from _helpers import client, eventually

pytestmark = pytest.mark.timeout(90)


async def register(r: aioredis.Redis, service: str, n: int) -> None:
    """``n`` registrations in one MULTI/EXEC: every blocked reader wakes to all of them at once."""
    async with r.pipeline(transaction=True) as pipe:
        for i in range(n):
            pipe.xadd(
                input_stream(service),
                {"lbs-input": json.dumps({"DataStreamName": f"long-{i}", "Info": {}})},
            )
        await pipe.execute()


async def read(
    r: aioredis.Redis, service: str, consumer: str, count: int, window: int | str
) -> list[Any]:
    """One read-3.lua call (names locked, fair dispatch with ``window`` ms; "" off): the entries read."""
    entries, _tokens, _ = await r.eval(
        source("read-3"),
        3,
        input_stream(service),
        fence_key(service),
        consumers_key(service),
        group_name(service),
        consumer,
        count,
        60_000,
        lock_key(service, ""),
        ">",
        "",
        consumer,
        "",
        "",
        "",
        key_prefix(service),
        window,
    )
    return list(entries)


async def test_long_registrations_spread_over_idle_consumers(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    release = asyncio.Event()
    running: Counter[str] = Counter()

    async def handler(note: lbs.Notification, who: str) -> None:
        running[who] += 1
        await release.wait()  # minutes of work, as far as dispatch can tell

    clients = [client(redis_server.url, service, f"c{i}") for i in range(3)]
    runs = [asyncio.create_task(c.run(lambda note, who=c.id: handler(note, who))) for c in clients]
    try:
        # Every consumer has read (and found nothing) before the work arrives: each is a live peer.
        await eventually(lambda: _consumers(r, service, 3))
        await register(r, service, 12)
        await eventually(lambda: _is(sum(running.values()), 12))
        assert sorted(running.values()) == [4, 4, 4], running
        release.set()
        await eventually(lambda: _is(r.xlen(input_stream(service)), 0))
    finally:
        release.set()
        for c in clients:
            await c.close()
        for t in runs:
            await t


async def test_a_lone_consumer_takes_what_it_can(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    release = asyncio.Event()
    running = 0

    async def handler(note: lbs.Notification) -> None:
        nonlocal running
        running += 1
        await release.wait()

    c = client(redis_server.url, service)
    run = asyncio.create_task(c.run(handler))
    try:
        await eventually(lambda: _consumers(r, service, 1))
        await register(r, service, 12)
        await eventually(lambda: _is(running, 12))
    finally:
        release.set()
        await c.close()
        await run


@pytest.mark.usefixtures("redis_server")
async def test_the_share_counts_only_live_peers(rr: aioredis.Redis, service: str) -> None:
    await rr.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    await peer(rr, service)
    await register(rr, service, 9)
    # One live peer holding nothing: half of the 9 waiting, rounded up.
    assert len(await read(rr, service, "me", 50, 60_000)) == 5
    # My share is taken (5 of 4 waiting + 5 held, over two): the next read takes nothing.
    assert await read(rr, service, "me", 50, 60_000) == []
    # The peer goes quiet past the window: not live, so the rest is mine.
    await asyncio.sleep(0.05)
    assert len(await read(rr, service, "me", 50, 20)) == 4


@pytest.mark.usefixtures("redis_server")
async def test_a_peer_whose_process_is_gone_is_no_peer(rr: aioredis.Redis, service: str) -> None:
    await rr.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    # It read a moment ago and holds nothing, but its instance marker lapsed (the process died, and
    # what it held was re-queued): the work is not left for it.
    await peer(rr, service, alive=False)
    await register(rr, service, 9)
    assert len(await read(rr, service, "me", 50, 60_000)) == 9


@pytest.mark.usefixtures("redis_server")
async def test_off_reads_up_to_count_whatever_the_peers(rr: aioredis.Redis, service: str) -> None:
    await rr.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    await peer(rr, service)
    await register(rr, service, 9)
    assert len(await read(rr, service, "me", 50, "")) == 9


@pytest.mark.usefixtures("redis_server")
async def test_the_share_is_counted_without_the_lag_too(rr: aioredis.Redis, service: str) -> None:
    await rr.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    await peer(rr, service)
    await register(rr, service, 10)
    # An entry not yet read deleted: Redis cannot tell the lag; the script counts what waits instead.
    middle = (await rr.xrange(input_stream(service)))[5][0]
    await rr.xdel(input_stream(service), middle)
    assert (await rr.xinfo_groups(input_stream(service)))[0]["lag"] is None
    assert len(await read(rr, service, "me", 50, 60_000)) == 5


async def peer(r: aioredis.Redis, service: str, alive: bool = True) -> None:
    """A consumer "peer" in the group holding nothing; ``alive``: with its process's instance marker."""
    await r.xgroup_createconsumer(input_stream(service), group_name(service), "peer")
    if alive:
        await r.set(instance_key(service, "peer"), "nonce", px=60_000)


async def _consumers(r: aioredis.Redis, service: str, n: int) -> bool:
    try:
        return len(await r.xinfo_consumers(input_stream(service), group_name(service))) == n
    except Exception:
        return False


async def _is(value: Any, expected: Any) -> bool:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        value = await value
    return bool(value == expected)
