"""Delayed keyed messages (issue 47, finding 3): ``Publisher.publish(..., delay=, at=)`` parks the
call, and a consumer's promotion task (``promote-4.lua``) publishes it to its keys when due.

"Not before its time" is judged by the server's clock alone: a message's id in its key's data stream
is the server's milliseconds when it was appended, at or after the server's time before the call
plus the delay. No other timing is asserted; every wait is for an event, bounded generously.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

import lbs
from lbs import _keys, _schedule
from lbs._redis.scripts import source
from lbs.producer import encode_input

pytestmark = pytest.mark.timeout(120)

CFG = dict(read_block=0.05, configure_keyspace_events=False, lock_ttl=2.0)


def keyed_client(url: str, service: str, consumer: str = "c1") -> lbs.Client:
    return lbs.Client(
        url,
        service,
        consumer_id=consumer,
        config=lbs.Config(**CFG),
        load_entrypoint_plugins=False,
    )


def publisher(url: str, service: str, **kw: Any) -> lbs.Publisher:
    return lbs.Publisher(url, service, load_entrypoint_plugins=False, **kw)


def ms_of(entry_id: str | bytes) -> int:
    return int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])


async def server_ms(r: aioredis.Redis) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


class Seen:
    """What a keyed handler saw, per key: (message id, n), and an event once ``want`` came."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.messages: dict[str, list[tuple[str, str]]] = {}
        self.enough = asyncio.Event()

    async def handle(self, batch: lbs.KeyedBatch) -> None:
        got = self.messages.setdefault(batch.key, [])
        got.extend((m.id, m.fields["n"]) for m in batch.messages)
        if sum(map(len, self.messages.values())) >= self.want:
            self.enough.set()

    def ns(self, key: str) -> list[str]:
        return [n for _, n in self.messages.get(key, [])]


async def test_a_delayed_message_comes_after_its_time_ordered_by_it(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """Published now, in 3 s and in 1.5 s: processed in that order of due times, each delayed one at
    or after its time by the server's clock; one published after them comes after them. The key
    lingers between them: the promotion wakes its holder as a publish does."""
    seen = Seen(4)
    c = keyed_client(any_server.url, service)
    runner = asyncio.create_task(c.run_keyed(seen.handle))
    try:
        async with publisher(any_server.url, service) as pub:
            await pub.publish("k", {"n": "now"})
            before = await server_ms(rr)
            late = await pub.publish("k", {"n": "late"}, delay=3)
            soon = await pub.publish("k", {"n": "soon"}, delay=timedelta(seconds=1.5))
            assert late != soon
            await asyncio.wait_for(_until(seen, "k", 3), 60)
            await pub.publish("k", {"n": "after"})
            await asyncio.wait_for(seen.enough.wait(), 60)
        assert seen.ns("k") == ["now", "soon", "late", "after"]
        ids = {n: i for i, n in seen.messages["k"]}
        assert ms_of(ids["soon"]) >= before + 1500 and ms_of(ids["late"]) >= before + 3000
        assert await rr.xlen(_keys.delayed_stream(service)) == 0
        assert await rr.exists(_keys.due_key(service)) == 0
    finally:
        await c.close()
        await runner


async def _until(seen: Seen, key: str, n: int) -> None:
    while len(seen.ns(key)) < n:
        await asyncio.sleep(0.02)


async def test_a_delayed_publish_survives_a_consumer_restart_and_comes_once(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """Twelve messages of a key and one of another, parked in one call: the consumer stops before
    they are due, the next one started after publishes them once, in order."""
    seen = Seen(13)  # by both consumers
    first = keyed_client(redis_server.url, service, "first")
    runner = asyncio.create_task(first.run_keyed(seen.handle))
    async with publisher(redis_server.url, service) as pub:
        due_at = datetime.now(timezone.utc) + timedelta(seconds=2)
        messages = [("k", {"n": str(i)}) for i in range(12)] + [("other", {"n": "x"})]
        parked = await pub.publish_many(messages, at=due_at)
    assert len(set(parked)) == 1  # one parked entry for the call
    await first.close()  # before its time, or not: either way it comes exactly once
    await runner
    # Nobody runs: it waits, parked, however long past its time.
    while await server_ms(r) < due_at.timestamp() * 1000 + 1200:
        await asyncio.sleep(0.1)
    if await r.xlen(_keys.delayed_stream(service)):  # first stopped before it was due
        assert not await r.exists(f"{_keys.key_prefix(service)}k:k")
    second = keyed_client(redis_server.url, service, "second")
    runner = asyncio.create_task(second.run_keyed(seen.handle))
    try:
        await asyncio.wait_for(seen.enough.wait(), 60)
        await asyncio.wait_for(_done(first, second, 2), 60)  # both keys drained and let go
        assert seen.ns("k") == [str(i) for i in range(12)] and seen.ns("other") == ["x"]
        assert all(ms_of(i) >= due_at.timestamp() * 1000 - 1 for i, _ in seen.messages["k"])
        assert await r.xlen(_keys.delayed_stream(service)) == 0
        assert await r.xlen(_keys.input_stream(service)) == 0
    finally:
        await second.close()
        await runner
    assert seen.ns("k") == [str(i) for i in range(12)]  # nothing came twice


async def _done(first: lbs.Client, second: lbs.Client, n: int) -> None:
    while first.stats.done + second.stats.done < n:
        await asyncio.sleep(0.02)


# -- promote-4.lua called directly ---------------------------------------------


async def promote(r: aioredis.Redis, service: str, batch: int = 100) -> list[Any]:
    return await r.eval(
        source("promote-4"),
        4,
        _keys.due_key(service),
        _keys.delayed_stream(service),
        _keys.input_stream(service),
        _keys.waiting_key(service),
        batch,
        _keys.group_name(service),
        _keys.key_prefix(service),
    )


def delayed_entry(*messages: tuple[str, str, str]) -> list[Any]:
    """A delayed publish's parked fields: ``(key, registration or "", n)`` per message."""
    entry: list[Any] = ["lbs-publish", len(messages)]
    for key, reg, n in messages:
        entry += [key, reg, 2, "n", n]
    return entry + [""] * (len(messages) % 2)


def reg(key: str) -> str:
    return encode_input(key, {}).decode()


async def park_due(r: aioredis.Redis, service: str, entries: list[list[Any]], ms: int) -> list[str]:
    """Park ``entries`` in one transaction (one millisecond of ids), due at ``ms`` (server time)."""
    return await _schedule.park(
        r, _keys.delayed_stream(service), _keys.due_key(service), entries, (True, ms)
    )


async def data(r: aioredis.Redis, service: str, key: str) -> list[str]:
    rows = await r.xrange(f"{_keys.key_prefix(service)}k:{key}")
    return [fields[b"n"].decode() for _, fields in rows]


async def test_one_due_time_comes_out_in_parked_order_across_batches(
    rr: aioredis.Redis, service: str
) -> None:
    """Twelve delayed publishes of one key parked in one millisecond (ids <ms>-0 to <ms>-11, which a
    sorted set orders as strings: "-10" before "-6"), six due at one time and six a millisecond
    later: appended in parked order, also when a batch would end inside the second due time (its
    ids then wait for the next call)."""
    now = await server_ms(rr)
    pipe = rr.pipeline(transaction=True)
    for i in range(12):
        parked_id = f"{now}-{i}"
        entry = delayed_entry(("k", reg("k"), str(i)))
        pipe.execute_command("XADD", _keys.delayed_stream(service), parked_id, *entry)
        pipe.zadd(_keys.due_key(service), {parked_id: now - 2 if i < 6 else now - 1})
    await pipe.execute()
    moved, vanished, next_ms, stuck, _ = await promote(rr, service, batch=8)
    assert (moved, vanished, next_ms, stuck) == (6, 0, 0, 0)  # the second due time left whole
    assert await promote(rr, service, batch=8) == [6, 0, -1, 0, 0]
    assert await data(rr, service, "k") == [str(i) for i in range(12)]
    # Registered once (the first), in force for the others.
    (entry,) = await rr.xrange(_keys.input_stream(service))
    assert entry[1] == {b"lbs-input": reg("k").encode(), b"lbs-keyed": b"1"}
    assert await rr.xlen(_keys.delayed_stream(service)) == 0
    assert await rr.exists(_keys.due_key(service)) == 0


async def test_a_delayed_publish_is_published_as_publish_would(
    rr: aioredis.Redis, service: str
) -> None:
    """Two keys in one parked call: both data streams created above the id floor, each key
    registered once; a hand-made malformed one is left parked (stuck), never half-published."""
    prefix = _keys.key_prefix(service)
    floor = await server_ms(rr) + 60_000  # a deleted data stream's last ms, ahead of the clock
    await rr.zadd(f"{prefix}idfloor", {"ms": floor})
    now = await server_ms(rr)
    good = delayed_entry(("a", reg("a"), "1"), ("b", reg("b"), "2"), ("a", "", "3"))
    bad = ["lbs-publish", 2, "a", reg("a"), 2, "n", "4", ""]  # says 2 messages, has 1
    await park_due(rr, service, [good, bad], now - 1)
    assert await promote(rr, service) == [1, 0, -1, 1, 0]
    assert await data(rr, service, "a") == ["1", "3"] and await data(rr, service, "b") == ["2"]
    (first_a, _), _ = await rr.xrange(f"{prefix}k:a")
    assert first_a.decode() == f"{floor + 1}-0"
    assert await rr.xlen(_keys.input_stream(service)) == 2
    assert await rr.xlen(_keys.delayed_stream(service)) == 1  # the malformed one, never due
    ((_, score),) = await rr.zrange(_keys.due_key(service), 0, -1, withscores=True)
    assert score == float("inf")


@pytest.mark.parametrize(
    ("where", "what"),
    [("k:k", "a data stream"), ("m:k", "a key state"), ("idfloor", "a sorted set")],
)
async def test_a_key_of_the_wrong_type_refuses_the_call_whole(
    rr: aioredis.Redis, service: str, where: str, what: str
) -> None:
    """A due delayed publish whose data stream, state or id floor is of another type: the call
    writes nothing (a retry due with it stays parked too), and goes on once the key is fixed."""
    now = await server_ms(rr)
    retry = [_keys.INPUT_FIELD, reg("plain")]
    await park_due(rr, service, [retry, delayed_entry(("k", reg("k"), "1"))], now - 1)
    bad = f"{_keys.key_prefix(service)}{where}"
    await rr.set(bad, "x")
    before = {k: await rr.dump(k) async for k in rr.scan_iter(match=f"*{service}*")}
    with pytest.raises(ResponseError) as info:
        await promote(rr, service)
    assert str(info.value).startswith(f"LBSKEY {bad} holds a string, not {what}")
    assert {k: await rr.dump(k) async for k in rr.scan_iter(match=f"*{service}*")} == before
    await rr.delete(bad)
    assert await promote(rr, service) == [2, 0, -1, 0, 0]
    assert await data(rr, service, "k") == ["1"]


@pytest.mark.parametrize(
    "when",
    [
        {"delay": -1},
        {"delay": float("inf")},
        {"delay": "10"},
        {"at": datetime.now() + timedelta(hours=1)},  # naive
        {"delay": 1, "at": datetime.now(timezone.utc) + timedelta(hours=1)},
    ],
    ids=["negative", "inf", "str", "naive-at", "both"],
)
async def test_a_bad_delay_or_at_raises_and_writes_nothing(
    r: aioredis.Redis, service: str, when: dict[str, Any]
) -> None:
    async with publisher(r, service) as pub:
        with pytest.raises(lbs.ConfigurationError):
            await pub.publish("k", {"n": 1}, **when)
        with pytest.raises(lbs.ConfigurationError):
            await pub.publish_many([("k", {"n": 1})], **when)
    assert [k async for k in r.scan_iter(match=f"*{service}*")] == []


async def test_no_delay_or_an_at_past_publishes_now(r: aioredis.Redis, service: str) -> None:
    async with publisher(r, service) as pub:
        await pub.publish("k", {"n": "0"}, delay=0)
        await pub.publish_many(
            [("k", {"n": "1"})], at=datetime.now(timezone.utc) - timedelta(hours=1)
        )
    assert await data(r, service, "k") == ["0", "1"]
    assert await r.exists(_keys.delayed_stream(service), _keys.due_key(service)) == 0


async def test_a_sharded_publisher_parks_in_each_keys_shard(
    r: aioredis.Redis, service: str
) -> None:
    keys = [f"key-{i}" for i in range(8)]
    async with publisher(r, service, shards=3) as pub:
        ids = await pub.publish_many([(k, {"n": k}) for k in keys], delay=3600)
        shard_of = {k: pub.services[_keys.shard_of(k, 3)] for k in keys}
    for svc in set(shard_of.values()):
        ((parked_id, fields),) = await r.xrange(_keys.delayed_stream(svc))
        mine = [k for k in keys if shard_of[k] == svc]
        assert [ids[keys.index(k)] for k in mine] == [parked_id.decode()] * len(mine)
        assert fields[b"lbs-publish"] == str(len(mine)).encode()
        assert await r.zcard(_keys.due_key(svc)) == 1
