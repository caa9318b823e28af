"""Producer against a real Redis: the entries it writes are the Go wire format."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

import lbs


async def test_add_stream_writes_one_lbs_entry(r: aioredis.Redis, service: str) -> None:
    producer = lbs.Producer(r, service)
    entry_id = await producer.add_stream("session-1", {"user": "u1", "n": 2})
    entries = await r.xrange(lbs.input_stream(service))
    assert [(i.decode(), f) for i, f in entries] == [
        (entry_id, {b"lbs-input": b'{"DataStreamName":"session-1","Info":{"user":"u1","n":2}}'})
    ]


async def test_add_streams_is_one_round_trip_and_keeps_order(r: aioredis.Redis, service: str) -> None:
    producer = lbs.Producer(r, service)
    names = [f"s{i}" for i in range(50)]
    ids = await producer.add_streams([names[0], *((n, {"i": i}) for i, n in enumerate(names[1:], 1))])
    assert len(ids) == 50 and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    entries = await r.xrange(lbs.input_stream(service))
    decoded = [json.loads(f[b"lbs-input"])["DataStreamName"] for _, f in entries]
    assert decoded == names
    assert await producer.add_streams([]) == []


async def test_bad_stream_in_a_batch_registers_nothing(r: aioredis.Redis, service: str) -> None:
    producer = lbs.Producer(r, service)
    with pytest.raises(lbs.InvalidInputError):
        await producer.add_streams(["ok", ("", None), "also-ok"])
    assert await r.exists(lbs.input_stream(service)) == 0


async def test_url_client_is_owned_and_closed(redis_server, service: str) -> None:  # type: ignore[no-untyped-def]
    async with lbs.Producer(redis_server.url, service) as producer:
        assert await producer.add_stream("x")
    # A client passed in is the caller's: close() leaves it usable.
    client = aioredis.Redis.from_url(redis_server.url)
    async with lbs.Producer(client, service):
        pass
    assert await client.ping()
    await client.aclose()


def test_redis_argument_is_checked() -> None:
    with pytest.raises(lbs.ConfigurationError, match="redis must be"):
        lbs.Producer(42, "svc")  # type: ignore[arg-type]


async def test_producer_works_on_redis7(redis7_server, service: str) -> None:  # type: ignore[no-untyped-def]
    async with lbs.Producer(redis7_server.url, service) as producer:
        ids = await producer.add_streams(["a", "b"])
    client = aioredis.Redis.from_url(redis7_server.url)
    try:
        assert await client.xlen(lbs.input_stream(service)) == len(ids) == 2
    finally:
        await client.aclose()
