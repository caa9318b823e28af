"""Producer against a real Redis: the entries it writes are the Go wire format."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
import redis.exceptions

import lbs
from lbs.embedded import RedisServer

from _helpers import client, eventually, take


async def test_add_stream_writes_one_lbs_entry(r: aioredis.Redis, service: str) -> None:
    producer = lbs.Producer(r, service)
    entry_id = await producer.add_stream("session-1", {"user": "u1", "n": 2})
    entries = await r.xrange(lbs.input_stream(service))
    assert [(i.decode(), f) for i, f in entries] == [
        (entry_id, {b"lbs-input": b'{"DataStreamName":"session-1","Info":{"user":"u1","n":2}}'})
    ]


async def test_add_streams_is_one_round_trip_and_keeps_order(
    r: aioredis.Redis, service: str
) -> None:
    producer = lbs.Producer(r, service)
    names = [f"s{i}" for i in range(50)]
    ids = await producer.add_streams(
        [names[0], *((n, {"i": i}) for i, n in enumerate(names[1:], 1))]
    )
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


# -- bad input is refused at the producer, before anything is sent -------------------------------


def _payload_of_size(size: int, name: str = "big") -> dict[str, str]:
    """An Info whose lbs-input value for stream ``name`` is exactly ``size`` bytes."""
    base = len(lbs.encode_input(name, {"p": ""}))
    return {"p": "a" * (size - base)}


async def test_a_value_over_max_input_bytes_is_refused_and_nothing_is_written(
    r: aioredis.Redis, service: str
) -> None:
    info = _payload_of_size(65_537)
    assert len(lbs.encode_input("big", info)) == 65_537
    producer = lbs.Producer(r, service)
    with pytest.raises(lbs.InvalidInputError, match="65537 bytes, more than the limit of 65536"):
        await producer.add_stream("big", info)
    with pytest.raises(
        lbs.InvalidInputError, match=r"entry 1: .*65537 bytes, more than the limit of 65536"
    ):
        await producer.add_streams(["ok", ("big", info), "also-ok"])
    assert await r.xlen(lbs.input_stream(service)) == 0


async def test_a_value_at_max_input_bytes_is_sent_and_taken_without_dead_lettering(
    redis_server, r: aioredis.Redis, service: str
) -> None:  # type: ignore[no-untyped-def]
    at_limit, at_limit_2 = _payload_of_size(65_536), _payload_of_size(65_536, "big-2")
    async with lbs.Producer(r, service) as producer:  # both calls
        await producer.add_stream("big", at_limit)
        await producer.add_streams([("big-2", at_limit_2)])
    assert [len(f[b"lbs-input"]) for _, f in await r.xrange(lbs.input_stream(service))] == [
        65_536
    ] * 2
    c = client(redis_server.url, service)
    try:
        await c.start()
        notes = await take(c, 2)
        assert sorted((n.stream, n.info) for n in notes) == [
            ("big", at_limit),
            ("big-2", at_limit_2),
        ]
        assert await r.exists(lbs.dead_letter_stream(service)) == 0
    finally:
        await c.close()


async def test_one_byte_more_than_the_producer_sends_is_what_a_consumer_dead_letters(
    redis_server, r: aioredis.Redis, service: str
) -> None:  # type: ignore[no-untyped-def]
    # The producer's line and the consumer's are the same byte: 65,537 written
    # behind the producer's back is dead-lettered for its size.
    over = lbs.encode_input("big", _payload_of_size(65_537))
    await r.xadd(lbs.input_stream(service), {"lbs-input": over})
    c = client(redis_server.url, service)
    try:
        await c.start()
        dlq = lbs.dead_letter_stream(service)
        await eventually(lambda: _is(r.xlen(dlq), 1))
        ((_, fields),) = await r.xrange(dlq)
        assert b"65537 bytes, more than the limit of 65536" in fields[b"_reason"]
        assert fields[b"lbs-input"] == over
    finally:
        await c.close()


async def _is(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_a_smaller_max_input_bytes_is_the_producers_limit(
    r: aioredis.Redis, service: str
) -> None:
    async with lbs.Producer(r, service, max_input_bytes=100) as producer:
        assert producer.max_input_bytes == 100
        await producer.add_stream("big", _payload_of_size(100))
        with pytest.raises(lbs.InvalidInputError, match="101 bytes, more than the limit of 100"):
            await producer.add_stream("big", _payload_of_size(101))
    assert await r.xlen(lbs.input_stream(service)) == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "65536", None])
def test_max_input_bytes_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(lbs.ConfigurationError, match="max_input_bytes"):
        lbs.Producer("redis://127.0.0.1:1", "svc", max_input_bytes=bad)  # type: ignore[arg-type]


async def test_lone_surrogates_are_refused_naming_the_part(r: aioredis.Redis, service: str) -> None:
    producer = lbs.Producer(r, service)
    with pytest.raises(lbs.InvalidInputError, match=r"data stream name .*'\\ud800'.*UTF-8"):
        await producer.add_stream("\ud800")
    with pytest.raises(lbs.InvalidInputError, match=r"info of data stream 'ok' .*'\\udfff'.*UTF-8"):
        await producer.add_stream("ok", {"k": "x\udfff"})
    with pytest.raises(lbs.InvalidInputError, match=r"info .*'\\ud800'"):
        await producer.add_stream("ok", {"\ud800": 1})
    with pytest.raises(lbs.InvalidInputError, match=r"entry 1: data stream name"):
        await producer.add_streams(["a", "\ud800", "b"])
    with pytest.raises(lbs.InvalidInputError, match=r"entry 0: info"):
        await lbs.Producer(r, service, shards=2).add_streams([("a", {"x": ["\ud800"]})])
    with pytest.raises(lbs.InvalidInputError, match=r"data stream name"):
        await lbs.Producer(r, service, shards=2).add_stream("\ud800")  # before it is routed
    assert (
        await r.exists(
            lbs.input_stream(service),
            *map(lbs.input_stream, lbs.shard_services(service, 2)),
        )
        == 0
    )


def _nested(depth: int) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for _ in range(depth):
        info = {"a": info}
    return info


def _circular() -> dict[str, Any]:
    info: dict[str, Any] = {}
    info["me"] = info
    return info


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: p.add_stream(42), "name must be a str, got int"),
        (lambda p: p.add_stream(b"x"), "name must be a str, got bytes"),
        (lambda p: p.add_stream(""), "non-empty"),
        (lambda p: p.add_stream("x", ["a", "b"]), "info must be a mapping or None, got list"),
        (lambda p: p.add_stream("x", "info"), "info must be a mapping or None, got str"),
        (lambda p: p.add_stream("x", {"n": float("nan")}), "JSON"),
        (lambda p: p.add_stream("x", _nested(5000)), "nested too deeply"),
        (
            lambda p: p.add_streams(["a", ("x", _nested(5000))]),
            "entry 1: info of data stream 'x' is nested too deeply",
        ),
        (lambda p: p.add_stream("x", _circular()), "Circular reference"),
        (lambda p: p.add_streams("abc"), "not one str"),
        (lambda p: p.add_streams(7), "got int"),
        (
            lambda p: p.add_streams(["a", ("b",)]),
            r"entry 1: expected a name or a \(name, info\) pair",
        ),
        (lambda p: p.add_streams(["a", None]), "entry 1: expected"),
        (lambda p: p.add_streams(["a", ("b", 3)]), "entry 1: info must be a mapping"),
        (lambda p: p.add_streams(["a", (3, None)]), "entry 1: data stream name must be a str"),
    ],
)
async def test_bad_arguments_are_invalid_input_errors(
    r: aioredis.Redis, service: str, call: Any, message: str
) -> None:
    for shards in (1, 2):
        producer = lbs.Producer(r, service, shards=shards)
        with pytest.raises(lbs.InvalidInputError, match=message):
            await call(producer)
    assert (
        await r.exists(
            lbs.input_stream(service),
            *map(lbs.input_stream, lbs.shard_services(service, 2)),
        )
        == 0
    )


async def test_any_mapping_is_an_info(r: aioredis.Redis, service: str) -> None:
    producer = lbs.Producer(r, service)
    await producer.add_stream("x", MappingProxyType({"a": 1}))
    ((_, fields),) = await r.xrange(lbs.input_stream(service))
    assert fields[b"lbs-input"] == b'{"DataStreamName":"x","Info":{"a":1}}'


# -- a failed batch says what was written -------------------------------------------------------


def _names_by_shard(shards: int, per_shard: int) -> list[list[str]]:
    out: list[list[str]] = [[] for _ in range(shards)]
    i = 0
    while any(len(names) < per_shard for names in out):
        name = f"s{i}"
        if len(out[lbs.shard_of(name, shards)]) < per_shard:
            out[lbs.shard_of(name, shards)].append(name)
        i += 1
    return out


async def test_a_shard_that_fails_leaves_the_other_written_and_says_so(
    r: aioredis.Redis, service: str
) -> None:
    good, bad = _names_by_shard(2, 3)
    names = [good[0], bad[0], bad[1], good[1], good[2], bad[2]]
    bad_stream = lbs.input_stream(lbs.shard_services(service, 2)[1])
    await r.set(bad_stream, "x")  # the shard's LBS key has the wrong type: every XADD to it fails
    async with lbs.Producer(r, service, shards=2) as producer:
        with pytest.raises(lbs.BatchError) as info:
            await producer.add_streams(names)
    err = info.value
    assert isinstance(err, lbs.RedisOperationError) and err.operation == "add_streams"
    assert "WRONGTYPE" in str(err.cause) and err.__cause__ is err.cause
    assert "3 of 6 registered" in str(err)
    assert [i is None for i in err.entry_ids] == [False, True, True, False, False, True]
    assert err.unknown == []
    entries = await r.xrange(lbs.input_stream(lbs.shard_services(service, 2)[0]))
    assert [i.decode() for i, _ in entries] == [err.entry_ids[k] for k in (0, 3, 4)]
    assert [lbs.decode_input(f[b"lbs-input"])[0] for _, f in entries] == [good[0], good[1], good[2]]


async def test_a_batch_refused_for_memory_writes_nothing() -> None:
    with RedisServer() as server:
        r = aioredis.Redis.from_url(server.url)
        try:
            await r.config_set("maxmemory-policy", "noeviction")
            await r.config_set(
                "maxmemory", "1"
            )  # far below what the server uses: writes are refused
            for shards in (1, 2):
                async with lbs.Producer(r, "svc", shards=shards) as producer:
                    with pytest.raises(lbs.BatchError, match="OOM") as info:
                        await producer.add_streams(["a", "b", "c", "d"])
                    with pytest.raises(lbs.RedisOperationError, match="maxmemory"):
                        await producer.add_stream("e")
                assert info.value.entry_ids == [None] * 4 and info.value.unknown == []
                assert "0 of 4 registered" in str(info.value)
            assert await r.dbsize() == 0
        finally:
            await r.aclose()


async def test_a_connection_lost_after_sending_makes_the_batch_unknown(
    redis_server, r: aioredis.Redis, service: str
) -> None:  # type: ignore[no-untyped-def]
    # A proxy that passes the handshake through, then forwards the batch and
    # hangs up on the producer before any reply: Redis runs it, the producer
    # cannot know.
    upstreams: list[asyncio.StreamWriter] = []
    target = urlsplit(redis_server.url)

    async def handle(down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(target.hostname, target.port)
        upstreams.append(up_w)

        async def replies() -> None:
            while data := await up_r.read(65536):
                down_w.write(data)

        pump = asyncio.create_task(replies())
        while data := await down_r.read(65536):
            up_w.write(data)
            if b"MULTI" in data:
                pump.cancel()
                down_w.close()
                return

    proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    try:
        async with lbs.Producer(f"redis://127.0.0.1:{port}", service) as producer:
            with pytest.raises(lbs.BatchError, match="2 unknown") as info:
                await producer.add_streams(["a", "b"])
        assert info.value.unknown == [0, 1] and info.value.entry_ids == [None, None]
        assert isinstance(info.value.cause, redis.exceptions.ConnectionError)
        # Here they were registered after all: why a retry could duplicate them.
        await eventually(lambda: _is(r.xlen(lbs.input_stream(service)), 2))
    finally:
        for w in upstreams:
            w.close()
        proxy.close()
        await proxy.wait_closed()
