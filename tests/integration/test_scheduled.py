"""Scheduled registrations (issue 47, finding 3): ``Producer.add_stream(..., delay=, at=)`` parks the
entry as a retry is parked, and running consumers put it into the LBS when due.

"Not before its time" is judged by the server's clock alone: the due score is read right after the
producer wrote it, and the LBS entry the consumer receives got its id (the server's milliseconds)
when it was promoted. No other timing is asserted; every wait is for an event, bounded generously.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

import lbs
from lbs import _keys
from lbs._schedule import next_ids
from lbs.embedded import RedisClusterServers

from _helpers import client, eventually, take

pytestmark = pytest.mark.timeout(120)


def ms_of(entry_id: str | bytes) -> int:
    return int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])


async def server_ms(r: aioredis.Redis) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def test_a_delayed_registration_is_delivered_after_its_time_not_before(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    c = client(any_server.url, service)
    await c.start()
    try:
        async with lbs.Producer(any_server.url, service, load_entrypoint_plugins=False) as p:
            before = await server_ms(rr)
            parked = await p.add_stream("later", {"n": 1}, delay=1.5)
        due = await rr.zscore(_keys.due_key(service), parked)
        # Parked exactly as the LBS entry would be: lbs-input only, no retry counted.
        entries = await rr.xrange(_keys.delayed_stream(service))
        if due is not None and entries:  # not promoted yet (a loaded machine may take 1.5 s here)
            assert before + 1500 <= due
            assert entries == [
                (parked.encode(), {b"lbs-input": b'{"DataStreamName":"later","Info":{"n":1}}'})
            ]
        (note,) = await take(c, 1, timeout=30)
        assert note.stream == "later" and note.info == {"n": 1}
        assert ms_of(note.entry_id) >= (due if due is not None else before + 1500)
        await c.done_stream(note.stream)
        assert await rr.xlen(_keys.delayed_stream(service)) == 0
        assert await rr.zcard(_keys.due_key(service)) == 0
    finally:
        await c.close()


async def test_a_scheduled_registration_survives_a_consumer_restart_and_comes_once(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    first = client(redis_server.url, service, consumer="first")
    await first.start()
    async with lbs.Producer(redis_server.url, service, load_entrypoint_plugins=False) as p:
        due_at = datetime.now(timezone.utc) + timedelta(seconds=2)
        parked = await p.add_stream("at-two", at=due_at)
    await first.close()  # before its time, or not: either way it comes exactly once
    score = await r.zscore(_keys.due_key(service), parked)
    assert score is None or score == pytest.approx(due_at.timestamp() * 1000, abs=1)
    second = client(redis_server.url, service, consumer="second")
    await second.start()
    try:
        (note,) = await take(second, 1, timeout=30)
        assert note.stream == "at-two"
        assert ms_of(note.entry_id) >= due_at.timestamp() * 1000 - 1  # the server's clock decides
        await second.done_stream(note.stream)
        assert await r.xlen(_keys.input_stream(service)) == 0  # acked and deleted: it came once
        assert await r.xlen(_keys.delayed_stream(service)) == 0
    finally:
        await second.close()


async def test_an_at_in_the_past_or_no_delay_registers_now(r: aioredis.Redis, service: str) -> None:
    async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
        a = await p.add_stream("past", at=datetime.now(timezone.utc) - timedelta(hours=1))
        b = await p.add_stream("zero", delay=0)
        c = await p.add_streams(["x", "y"], delay=timedelta(0))
    entries = await r.xrange(_keys.input_stream(service))
    assert [e[0].decode() for e in entries] == [a, b, *c]
    assert await r.exists(_keys.delayed_stream(service), _keys.due_key(service)) == 0


@pytest.mark.parametrize(
    "when",
    [
        {"delay": -1},
        {"delay": float("nan")},
        {"delay": True},
        {"delay": "10"},
        {"at": datetime.now() + timedelta(hours=1)},  # naive
        {"at": "09:00"},
        {"delay": 1, "at": datetime.now(timezone.utc) + timedelta(hours=1)},
    ],
    ids=["negative", "nan", "bool", "str", "naive-at", "str-at", "both"],
)
async def test_a_bad_delay_or_at_raises_and_writes_nothing(
    r: aioredis.Redis, service: str, when: dict[str, Any]
) -> None:
    async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
        with pytest.raises(lbs.ConfigurationError):
            await p.add_stream("s", **when)
        with pytest.raises(lbs.ConfigurationError):
            await p.add_streams(["s"], **when)
    assert await r.exists(_keys.input_stream(service), _keys.delayed_stream(service)) == 0


async def test_many_at_once_each_parked_once_in_its_shards_keys(
    r: aioredis.Redis, service: str
) -> None:
    names = [f"s{i}" for i in range(40)]
    async with lbs.Producer(r, service, shards=3, load_entrypoint_plugins=False) as p:
        now = await server_ms(r)
        ids = await p.add_streams(names, delay=600)
        # Concurrent parkers on one parking stream: WATCH sends the losers round again.
        more = await asyncio.gather(*(p.add_stream(f"t{i}", delay=600) for i in range(20)))
    seen: dict[str, str] = {}
    for k, svc in enumerate(_keys.shard_services(service, 3)):
        for entry_id, fields in await r.xrange(_keys.delayed_stream(svc)):
            name = json.loads(fields[b"lbs-input"])["DataStreamName"]
            assert _keys.shard_of(name, 3) == k
            seen[name] = entry_id.decode()
            score = await r.zscore(_keys.due_key(svc), entry_id)
            assert score is not None and score >= now + 600_000
    assert seen == {**dict(zip(names, ids)), **{f"t{i}": m for i, m in enumerate(more)}}
    assert await r.exists(*(_keys.input_stream(s) for s in _keys.shard_services(service, 3))) == 0


async def test_parking_after_a_retry_and_a_promotion_keeps_ids_growing(
    r: aioredis.Redis, service: str
) -> None:
    """The parked id follows the parking stream's last id even when its top entry was deleted (a
    promotion's XDEL) or its clock is ahead of the server's (a failover to a slower clock)."""
    key = _keys.delayed_stream(service)
    future = f"{await server_ms(r) + 60_000}-5"
    await r.xadd(key, {"x": "1"}, id=future)
    await r.xdel(key, future)
    async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
        parked = await p.add_stream("next", delay=30)
    assert parked == f"{future.split('-')[0]}-6"
    assert next_ids((5, 2**64 - 1), 3, 2) == ["6-0", "6-1"]


async def test_a_parking_stream_of_the_wrong_type_fails_and_writes_nothing(
    r: aioredis.Redis, service: str
) -> None:
    await r.set(_keys.due_key(service), "oops")
    async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
        with pytest.raises(lbs.RedisOperationError):
            await p.add_stream("s", delay=5)
    assert await r.xlen(_keys.delayed_stream(service)) == 0
    await r.delete(_keys.due_key(service))
    await r.set(_keys.delayed_stream(service), "oops")
    async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
        with pytest.raises(lbs.RedisOperationError):
            await p.add_stream("s", delay=5)
    assert await r.exists(_keys.due_key(service)) == 0


@pytest.mark.cluster
async def test_a_cluster_parks_in_the_service_slot(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    rc = RedisCluster(host=redis_cluster.masters[0].host, port=redis_cluster.masters[0].port)
    c = client(rc, service)
    await c.start()
    try:
        async with lbs.Producer(rc, service, load_entrypoint_plugins=False) as p:
            await p.add_stream("clustered", delay=0.5)
        (note,) = await take(c, 1, timeout=30)
        assert note.stream == "clustered"
        await c.done_stream(note.stream)
    finally:
        await c.close()
        await rc.aclose()


async def test_an_idle_consumer_promotes_a_producers_parked_entry(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """Nothing parked when the consumer started: its idle poll still finds the producer's entry."""
    c = client(redis_server.url, service)
    await c.start()
    try:
        await asyncio.sleep(0.2)  # the promotion task's first look found nothing: it idles
        async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
            await p.add_stream("idle", delay=0.2)
        (note,) = await take(c, 1, timeout=30)
        assert note.stream == "idle"
        await c.done_stream(note.stream)
        await eventually(lambda: _empty(r, service))
    finally:
        await c.close()


async def _empty(r: aioredis.Redis, service: str) -> bool:
    return await r.xlen(_keys.delayed_stream(service)) == 0 == await r.zcard(_keys.due_key(service))
