"""Keyed, ordered processing on a real server: Publisher -> run_keyed -> commit, fenced, let go when drained."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys
from lbs.status import collect_status

from _helpers import eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def url(any_server: Any) -> str:
    """Each test runs on Redis 8.x, then on Debian's 7.0."""
    return str(any_server.url)


CFG = dict(read_block=0.05, configure_keyspace_events=False, lock_ttl=2.0)


def keyed_client(url: str, service: str, consumer: str = "c1", **kw: Any) -> lbs.Client:
    return lbs.Client(
        url,
        service,
        consumer_id=consumer,
        config=lbs.Config(**{**CFG, **kw}),
        load_entrypoint_plugins=False,
    )


async def leftovers(r: aioredis.Redis, service: str) -> list[bytes]:
    """Keys of the service besides the LBS and the bookkeeping every consumer keeps: keys' data
    streams and states, and consumers' leases and token records (a closed consumer keeps none)."""
    tag = _keys.hash_tag(service)
    found = [k async for k in r.scan_iter(match=f"*{tag}*")]
    kinds = (f"{tag}:k:", f"{tag}:m:", _keys.lease_prefix(service), _keys.tokens_prefix(service))
    return sorted(k for k in found if k.decode().startswith(kinds))


async def test_messages_of_each_key_are_processed_in_order_and_leave_nothing(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    seen: dict[str, list[int]] = defaultdict(list)
    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([(f"t{k}", {"n": i}) for i in range(20) for k in range(5)])
    c = keyed_client(url, service)

    async def handle(batch: lbs.KeyedBatch) -> None:
        assert batch.retry_count == 0 and batch.token > 0
        seen[batch.key].extend(int(m.fields["n"]) for m in batch.messages)

    runner = asyncio.create_task(c.run_keyed(handle, batch=7))
    await eventually(lambda: _all(seen, 5, 20))
    await eventually(lambda: _released(c, 5))
    await c.close()
    await runner
    assert dict(seen.items()) == {f"t{k}": list(range(20)) for k in range(5)}
    assert await leftovers(rr, service) == []
    assert await rr.xlen(_keys.input_stream(service)) == 0


async def test_wait_finished_counts_the_keys_let_go(url: str, service: str) -> None:
    """Under run_keyed, a key drained and let go is a finished stream: wait_finished returns."""
    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([(f"t{k}", {"n": 1}) for k in range(3)])
    c = keyed_client(url, service)

    async def handle(batch: lbs.KeyedBatch) -> None:
        pass

    runner = asyncio.create_task(c.run_keyed(handle))
    try:
        await c.wait_finished(3, timeout=30)
        assert c.stats.finished == c.stats.done == 3
    finally:
        await c.close()
        await runner


async def _all(seen: dict[str, list[int]], keys: int, n: int) -> bool:
    return len(seen) == keys and all(len(v) >= n for v in seen.values())


async def _released(c: lbs.Client, n: int) -> bool:
    return c.stats.done >= n


async def test_messages_that_come_while_a_drained_key_is_processed_follow_in_the_commits_reply(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """A short batch commits with "last:<n>" (nothing read behind it): what came meanwhile is in the
    commit's reply, handed over in order in the same hold, and the key is let go once drained."""
    seen: list[tuple[int, list[int]]] = []
    c = keyed_client(url, service)
    async with lbs.Publisher(url, service) as pub:
        await pub.publish("t", {"n": 0})

        async def handle(batch: lbs.KeyedBatch) -> None:
            seen.append((batch.token, [int(m.fields["n"]) for m in batch.messages]))
            if len(seen) < 3:  # two more arrive while this batch is processed
                await pub.publish_many(
                    [("t", {"n": 2 * len(seen) - 1}), ("t", {"n": 2 * len(seen)})]
                )

        runner = asyncio.create_task(c.run_keyed(handle, batch=5))
        await eventually(lambda: _released(c, 1))
    await c.close()
    await runner
    assert [ns for _, ns in seen] == [[0], [1, 2], [3, 4]]
    assert len({token for token, _ in seen}) == 1  # one hold: the commits went on
    assert await rr.xlen(_keys.input_stream(service)) == 0 and await leftovers(rr, service) == []


async def test_a_key_is_registered_once_while_registered(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    async with lbs.Publisher(url, service) as pub:
        await pub.publish("t1", {"n": 1})
        await pub.publish("t1", {"n": 2})
        await pub.publish_many([("t1", {"n": 3}), ("t2", {"n": 1})])
    assert await rr.xlen(_keys.input_stream(service)) == 2  # t1 and t2, once each
    assert await rr.xlen(_keys.keyed_stream(service, "t1")) == 3


async def test_a_message_published_while_the_holder_lets_go_is_never_stranded(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """The publish/done race, hammered: a publisher and a finishing holder in parallel, many rounds."""
    got: list[int] = []
    c = keyed_client(url, service)

    async def handle(batch: lbs.KeyedBatch) -> None:
        got.extend(int(m.fields["n"]) for m in batch.messages)

    runner = asyncio.create_task(c.run_keyed(handle, batch=3))
    rounds = 300
    async with lbs.Publisher(url, service) as pub:
        for i in range(rounds):
            await pub.publish("hot", {"n": i})
            if i % 7 == 0:
                await asyncio.sleep(0.002)  # let the holder drain and let go between some of them
    await eventually(lambda: _is(len(got), rounds), timeout=30)
    await c.close()
    await runner
    assert got == list(range(rounds))  # in order, none lost, none twice
    assert await leftovers(rr, service) == []


async def _is(a: int, b: int) -> bool:
    return a == b


async def test_a_failing_message_is_retried_alone_then_dead_lettered_and_the_key_goes_on(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """A failed batch's effects are dropped and the batch comes again; the poison message, once it
    failed in more than max_retries holds, is dead-lettered, and the key goes on after it."""
    out = _keys.hash_tag(service) + ":out"
    failures: list[int] = []
    c = keyed_client(url, service, max_retries=2, retry_delay=0.02, retry_delay_max=0.05)

    async def handle(batch: lbs.KeyedBatch) -> None:
        for m in batch.messages:
            if m.fields["n"] == "3":
                failures.append(batch.retry_count)
                raise ValueError("poison")
            batch.emit(out, {"n": m.fields["n"]}, m)

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(6)])
    runner = asyncio.create_task(c.run_keyed(handle, batch=10))
    await eventually(lambda: _released(c, 1), timeout=30)
    await c.close()
    await runner
    assert [int(f[b"n"]) for _, f in await rr.xrange(out)] == [0, 1, 2, 4, 5]  # each effect once
    assert failures[-3:] == [0, 1, 2]  # the poison's own holds: 1 + max_retries
    (letter,) = await rr.xrange(_keys.dead_letter_stream(service))
    fields = letter[1]
    assert fields[b"n"] == b"3" and fields[b"_key"] == b"t" and fields[b"_retry_count"] == b"2"
    assert b"failed in 3 holds" in fields[b"_reason"]
    assert await leftovers(rr, service) == []


async def test_a_keyed_dead_letter_replayed_is_published_again_to_its_key(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """lbs dlq replay of a keyed message: appended to its key (after what came since), the key
    registered again, the letter gone in the same transaction; the fixed handler processes it.
    With max_retries=0 the failed batch's first message, tried alone, is not dead-lettered."""
    fixed = False
    seen: list[tuple[str, dict[str, str]]] = []
    c = keyed_client(url, service, max_retries=0, retry_delay=0.01, retry_delay_max=0.01)

    async def handle(batch: lbs.KeyedBatch) -> None:
        ok = []
        for m in batch.messages:
            if m.fields["n"] == "bad" and not fixed:
                raise ValueError("poison")
            ok.append((batch.key, dict(m.fields)))
        seen.extend(ok)

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": "0"}), ("t", {"n": "bad"}), ("t", {"n": "2"})])
    runner = asyncio.create_task(c.run_keyed(handle, batch=10))
    await eventually(lambda: _released(c, 1), timeout=30)
    assert [f["n"] for _, f in seen] == ["0", "2"]
    fixed = True
    async with lbs.DeadLetters(url, service) as dlq:
        (letter,) = await dlq.list()
        assert letter.key == "t"
        (replay,) = await dlq.replay(all=True)
        assert (replay.outcome, replay.stream) == ("replayed", "t")
        assert await dlq.count() == 0
    await eventually(lambda: _released(c, 2), timeout=30)
    await c.close()
    await runner
    key, fields = seen[-1]
    assert key == "t" and fields["n"] == "bad" and fields["_replayed_from"] == letter.id
    assert fields["_replay_count"] == "1" and "failed in 2 holds" in fields["_last_reason"]
    assert not {"_reason", "_key", "_failed_id", "_retry_count", "_consumer", "_traceback"} & set(
        fields
    )
    assert await leftovers(rr, service) == []


async def _xackdel(r: aioredis.Redis) -> int:
    """commit-1.lua's ARGV[4] for this server: 1 where XACKDEL exists (Redis >= 8.2)."""
    version = tuple(int(x) for x in (await r.info("server"))["redis_version"].split(".")[:2])
    return 1 if version >= (8, 2) else 0


async def test_a_zombie_holder_cannot_commit(url: str, service: str, rr: aioredis.Redis) -> None:
    """A holder whose lease lapsed (stalled past its TTL) is refused, whether its lease is gone or taken
    again under a new value; the position never moves."""
    from lbs._redis.scripts import source

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(3)])
    stream, prefix, group = (
        _keys.input_stream(service),
        _keys.key_prefix(service),
        _keys.group_name(service),
    )
    leases, lease = _keys.lease_prefix(service), _keys.lease_key(service, "zombie")
    await rr.xgroup_create(stream, group, id="0")
    ((_, ((entry, _),)),) = await rr.xreadgroup(group, "zombie", {stream: ">"})
    entry = entry.decode()
    await rr.set(lease, "n1", px=60_000)
    (ours,) = await rr.eval(
        source("fetch-1"), 1, stream, prefix, leases, 10, group, "t", entry, "7:zombie:n1"
    )
    assert ours == [
        1,
        1,
        b"",
        0,
        0,
        b"",
    ]  # ours, first try, nothing committed yet, no failure isolated
    first = (await rr.xrange(_keys.keyed_stream(service, "t"), count=1))[0][0].decode()
    out = _keys.hash_tag(service) + ":out"
    commit = (
        source("commit-1"),
        1,
        stream,
        prefix,
        leases,
        group,
        await _xackdel(rr),
        _keys.dead_letter_stream(service),
        "_",
        3,
        "zombie",
        "t",
        entry,
        "7:zombie:n1",
        first,
        "go",
        "{}",
        "",
        "",
        1,
        out,
        2,
        "n",
        "0",
    )
    await rr.delete(lease)  # the lease lapsed: the zombie's hold is over
    assert await rr.eval(*commit) == [[2]]
    await rr.set(lease, "n1.2", px=60_000)  # taken again by the zombie's process, under a new value
    assert await rr.eval(*commit) == [[2]]
    assert await rr.hget(_keys.key_state(service, "t"), "pos") is None  # the position never moved
    assert await rr.xlen(_keys.keyed_stream(service, "t")) == 3
    assert await rr.exists(out) == 0  # and its effect was not written


async def test_status_lists_held_keys_with_backlog_and_position(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    gate = asyncio.Event()
    first_batch = asyncio.Event()

    async def handle(batch: lbs.KeyedBatch) -> None:
        first_batch.set()
        if batch.messages[0].fields["n"] != "0":
            await gate.wait()  # holds the key after its first commit

    async with lbs.Publisher(url, service) as pub:
        ids = await pub.publish_many([("busy", {"n": i}) for i in range(5)])
    c = keyed_client(url, service)
    runner = asyncio.create_task(c.run_keyed(handle, batch=2))
    await eventually(lambda: _is_set(first_batch))

    async def committed_once() -> bool:
        return await rr.hget(_keys.key_state(service, "busy"), "pos") is not None

    await eventually(committed_once)
    st = await collect_status(url, service)
    (key,) = st.keys
    assert (key.key, key.consumer, key.backlog, key.tries, key.holder) == (
        "busy",
        "redis-consumer-c1",
        3,
        1,
        True,
    )
    assert (key.failures, key.isolating) == (0, False)
    assert key.position == ids[1]  # the first batch (messages 0 and 1) committed
    assert st.to_dict()["keys"][0]["key"] == "busy"
    gate.set()
    await eventually(lambda: _released(c, 1))
    await c.close()
    await runner
    assert (await collect_status(url, service)).keys == ()


async def _is_set(event: asyncio.Event) -> bool:
    return event.is_set()


async def test_a_failed_batch_waits_out_the_retry_delay_and_a_publish_meanwhile_does_not_jump_it(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    seen: list[list[str]] = []
    c = keyed_client(url, service, retry_delay=2.0, retry_delay_max=2.0)

    async def handle(batch: lbs.KeyedBatch) -> None:
        seen.append([m.fields["n"] for m in batch.messages])
        if len(seen) == 1:
            raise ValueError("the downstream is down")

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": 0}), ("t", {"n": 1})])
        runner = asyncio.create_task(c.run_keyed(handle))
        parked = _keys.delayed_stream(service)

        async def is_parked() -> bool:
            return await rr.xlen(parked) == 1 and await rr.xlen(_keys.input_stream(service)) == 0

        await eventually(
            is_parked
        )  # parked for 1-2 s (jittered): the key is out of the LBS meanwhile
        ((parked_id, fields),) = await rr.xrange(parked)
        assert fields[b"lbs-keyed"] == b"1" and await rr.zcard(_keys.due_key(service)) == 1
        await pub.publish("t", {"n": 2})  # a registration in force: parked, so no new one
        assert await rr.xlen(_keys.input_stream(service)) == 0
        assert await rr.hget(_keys.key_state(service, "t"), "reg") == parked_id
    await eventually(lambda: _released(c, 1), timeout=30)
    await c.close()
    await runner
    assert seen == [
        ["0", "1"],
        ["0"],
        ["1"],
        ["2"],
    ]  # the failed batch one message at a time, then on
    assert await leftovers(rr, service) == []


async def test_a_server_that_lost_its_scripts_gets_them_again(
    url: str, service: str, rr: aioredis.Redis, any_server: Any
) -> None:
    """A restart or a failover empties the script cache: the commit that meets NOSCRIPT loads the
    scripts and goes again (its effects, written by the script, once)."""
    out = _keys.hash_tag(service) + ":out"
    seen: list[str] = []
    c = keyed_client(url, service)

    async def handle(batch: lbs.KeyedBatch) -> None:
        if not seen:
            await rr.script_flush()
        seen.extend(m.fields["n"] for m in batch.messages)
        for m in batch.messages:
            batch.emit(out, {"n": m.fields["n"]}, m)

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(4)])
    runner = asyncio.create_task(c.run_keyed(handle, batch=2))
    await eventually(lambda: _released(c, 1), timeout=30)
    await c.close()
    await runner
    assert seen == ["0", "1", "2", "3"]
    assert await leftovers(rr, service) == []
    assert [f[b"n"].decode() for _, f in await rr.xrange(out)] == ["0", "1", "2", "3"]


async def test_a_hot_key_yields_after_max_hold_messages_so_others_are_not_starved(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    order: list[tuple[str, int]] = []
    c = keyed_client(url, service)

    async def handle(batch: lbs.KeyedBatch) -> None:
        order.extend((batch.key, int(m.fields["n"])) for m in batch.messages)

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("hot", {"n": i}) for i in range(50)])
        await pub.publish("cold", {"n": 0})
    # One key at a time: the hot key, taken first, must let the cold one in.
    runner = asyncio.create_task(c.run_keyed(handle, 1, batch=5, max_hold_messages=10))
    await eventually(lambda: _released(c, 2), timeout=30)
    await c.close()
    await runner
    assert [n for k, n in order if k == "hot"] == list(range(50))
    assert order.index(("cold", 0)) <= 10  # after the hot key's first hold of 10, not after all 50
    assert c.stats.handed_back >= 1  # the hot key yielded


async def test_keys_of_the_wrong_type_are_refused_whole_and_the_others_go_on(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """fetch-1 and commit-1 on a batch where one key's state or data stream is garbage: that key is
    refused with nothing of it written, the other key of the same call goes through."""
    from lbs._redis.scripts import source

    stream, prefix, leases = (
        _keys.input_stream(service),
        _keys.key_prefix(service),
        _keys.lease_prefix(service),
    )
    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("good", {"n": 1}), ("bad", {"n": 1})])
    await rr.xgroup_create(stream, _keys.group_name(service), id="0")
    ((_, entries),) = await rr.xreadgroup(_keys.group_name(service), "c", {stream: ">"})
    (good, _), (bad, _) = [(e.decode(), f) for e, f in entries]
    await rr.set(_keys.lease_key(service, "c"), "n", px=60_000)  # both held under c's lease
    await rr.delete(_keys.key_state(service, "bad"))
    await rr.rpush(_keys.key_state(service, "bad"), "garbage")
    out = await rr.eval(
        source("fetch-1"),
        1,
        stream,
        prefix,
        leases,
        10,
        _keys.group_name(service),
        "good",
        good,
        "5:c:n",
        "bad",
        bad,
        "5:c:n",
    )
    assert out[0][0] == 1 and out[1] == [
        4,
        f"{_keys.key_state(service, 'bad')} holds a list".encode(),
    ]
    assert await rr.lrange(_keys.key_state(service, "bad"), 0, -1) == [b"garbage"]
    # The good key's data stream turns to garbage before its commit: refused, nothing of it written.
    first = (await rr.xrange(_keys.keyed_stream(service, "good")))[0][0].decode()
    await rr.delete(_keys.keyed_stream(service, "good"))
    await rr.rpush(_keys.keyed_stream(service, "good"), "garbage")
    before = await rr.hgetall(_keys.key_state(service, "good"))
    (refused,) = await rr.eval(
        source("commit-1"),
        1,
        stream,
        prefix,
        leases,
        _keys.group_name(service),
        await _xackdel(rr),
        _keys.dead_letter_stream(service),
        "_",
        3,
        "c",
        "good",
        good,
        "5:c:n",
        first,
        "go",
        "{}",
        "",
        "",
        0,
    )
    assert refused == [2]
    assert await rr.hgetall(_keys.key_state(service, "good")) == before
    # Still held: pending to c, whose lease holds its nonce.
    pending = await rr.xpending_range(stream, _keys.group_name(service), good, good, 1)
    assert [p["consumer"] for p in pending] == [b"c"]
    assert await rr.get(_keys.lease_key(service, "c")) == b"n"


# -- the promises users rely on: ids that only grow, effects once, poison costs one message ---------


async def drained(c: lbs.Client, handle: lbs.KeyedHandler, *, batch: int, keys: int = 1) -> None:
    """``c.run_keyed(handle)`` until ``keys`` keys were drained and let go, then closed."""
    runner = asyncio.create_task(c.run_keyed(handle, batch=batch))
    try:
        await c.wait_finished(keys, timeout=30)
    finally:
        await c.close()
        await runner


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


async def test_ids_only_grow_and_no_effect_is_lost_when_a_key_is_published_as_soon_as_it_is_let_go(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """Each message is published the moment the key is let go (its data stream deleted), so many
    start a new data stream in the millisecond the old one ended: ids still grow, and every
    message's effect is written (an effect id built from a repeated message id was taken for the
    earlier message's and dropped)."""
    rounds = 600
    out = _keys.hash_tag(service) + ":out"
    c = keyed_client(url, service)

    async def handle(batch: lbs.KeyedBatch) -> None:
        for m in batch.messages:
            batch.emit(out, {"n": m.fields["n"], "id": m.id}, m)

    runner = asyncio.create_task(c.run_keyed(handle, linger=0))  # each message after a let-go
    ids: list[str] = []
    try:
        async with lbs.Publisher(url, service) as pub:
            for i in range(rounds):
                ids.append(await pub.publish("hot", {"n": i}))
                await c.wait_finished(
                    i + 1, timeout=30
                )  # let go: the next one starts a new data stream
    finally:
        await c.close()
        await runner
    assert all(_id(a) < _id(b) for a, b in itertools.pairwise(ids)), "a key's message ids went back"
    effects = [(int(f[b"n"]), f[b"id"].decode()) for _, f in await rr.xrange(out)]
    assert effects == list(zip(range(rounds), ids))  # each message's effect, once, in order
    assert await leftovers(rr, service) == []


async def test_a_key_published_in_the_millisecond_its_stream_was_deleted_starts_above_it(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """publish-1 starts a new data stream above the id floor commit-1 leaves (here set far ahead, as a
    let-go in the same millisecond or a clock step back would)."""
    floor_key = _keys.key_prefix(service) + "idfloor"
    ahead = int(time.time() * 1000) + 3_600_000
    await rr.zadd(floor_key, {"ms": ahead})
    async with lbs.Publisher(url, service) as pub:
        first, second = await pub.publish_many([("t", {"n": 0}), ("t", {"n": 1})])
        other = await pub.publish("u", {"n": 0})
    assert (_id(first), _id(second), _id(other)) == ((ahead + 1, 0), (ahead + 1, 1), (ahead + 1, 0))
    await rr.delete(floor_key)
    await rr.rpush(floor_key, "garbage")
    with pytest.raises(lbs.RedisOperationError, match="idfloor holds a list, not a sorted set"):
        async with lbs.Publisher(url, service) as pub:
            await pub.publish("new-key", {"n": 0})
    assert await rr.exists(_keys.keyed_stream(service, "new-key")) == 0  # refused before any write


@pytest.mark.parametrize("poison", [0, 4, 9])
async def test_a_poison_message_costs_one_message_and_exactly_the_documented_holds(
    url: str, service: str, rr: aioredis.Redis, poison: int, any_server: Any
) -> None:
    """15 messages, batches of 10, the message at ``poison`` always raises, max_retries 3: the first
    batch fails once; then each of its messages is tried alone: those before the poison succeed
    and are committed once, the poison fails alone 3 more times (1 + max_retries = 4 failing
    holds) and is dead-lettered with its exception and traceback; the rest goes on."""
    if any_server.valkey and poison != 4:  # 15 s each: Valkey's commits are 7.0's (XACK + XDEL)
        pytest.skip(
            "on Valkey the middle position only; Redis 7.0 runs the same commits at all three"
        )
    out = _keys.hash_tag(service) + ":out"
    calls: list[list[int]] = []
    failing = 0
    c = keyed_client(url, service, max_retries=3, retry_delay=0.01, retry_delay_max=0.02)

    async def handle(batch: lbs.KeyedBatch) -> None:
        nonlocal failing
        ns = [int(m.fields["n"]) for m in batch.messages]
        calls.append(ns)
        for m in batch.messages:
            if int(m.fields["n"]) == poison:
                failing += 1
                raise ValueError(f"poison {poison}")
            batch.emit(out, {"n": m.fields["n"]}, m)

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(15)])
    await drained(c, handle, batch=10)
    alone = [[n] for n in range(10) if n != poison]
    assert failing == 4
    assert calls == [
        list(range(10)),
        *alone[:poison],
        [poison],
        [poison],
        [poison],
        *alone[poison:],
        [10, 11, 12, 13, 14],
    ]
    assert [int(f[b"n"]) for _, f in await rr.xrange(out)] == [n for n in range(15) if n != poison]
    (letter,) = await rr.xrange(_keys.dead_letter_stream(service))
    fields = letter[1]
    assert (
        fields[b"n"] == str(poison).encode()
        and fields[b"_key"] == b"t"
        and fields[b"_retry_count"] == b"3"
    )
    assert fields[b"_reason"] == f"failed in 4 holds; ValueError: poison {poison}".encode()
    assert fields[b"_consumer"] == b"redis-consumer-c1"
    assert b'raise ValueError(f"poison {poison}")' in fields[b"_traceback"]
    assert c.stats.dead_lettered == 1 and c.stats.handler_failures == 4
    assert await leftovers(rr, service) == []


async def test_an_effect_that_cannot_be_written_fails_its_batch_instead_of_committing(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """Message 2's effect targets a key of the wrong type: its batch is refused whole (nothing written),
    isolated, and message 2 dead-lettered with the reason; every other effect is written once."""
    out, bad = _keys.hash_tag(service) + ":out", _keys.hash_tag(service) + ":bad"
    await rr.rpush(bad, "not a stream")
    c = keyed_client(url, service, max_retries=1, retry_delay=0.01, retry_delay_max=0.02)

    async def handle(batch: lbs.KeyedBatch) -> None:
        for m in batch.messages:
            batch.emit(bad if m.fields["n"] == "2" else out, {"n": m.fields["n"]}, m)

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(5)])
    await drained(c, handle, batch=10)
    assert [int(f[b"n"]) for _, f in await rr.xrange(out)] == [0, 1, 3, 4]
    assert await rr.lrange(bad, 0, -1) == [b"not a stream"]
    (letter,) = await rr.xrange(_keys.dead_letter_stream(service))
    assert letter[1][b"n"] == b"2"
    assert (
        letter[1][b"_reason"]
        == f"failed in 2 holds; an effect cannot be written: {bad} holds a list, not a stream".encode()
    )


async def test_a_commit_sent_again_after_its_reply_was_lost_writes_its_effects_once(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """commit-1 twice with the same step (a connection dropped after sending): the second finds the
    position moved already and writes no effect again; a failure sent twice is counted once."""
    from lbs._redis.scripts import source

    stream, prefix, leases, group = (
        _keys.input_stream(service),
        _keys.key_prefix(service),
        _keys.lease_prefix(service),
        _keys.group_name(service),
    )
    out = _keys.hash_tag(service) + ":out"
    async with lbs.Publisher(url, service) as pub:
        ids = await pub.publish_many([("t", {"n": i}) for i in range(4)])
    await rr.xgroup_create(stream, group, id="0")
    ((_, ((entry, _),)),) = await rr.xreadgroup(group, "c", {stream: ">"})
    entry = entry.decode()
    await rr.set(_keys.lease_key(service, "c"), "n", px=60_000)
    await rr.eval(source("fetch-1"), 1, stream, prefix, leases, 10, group, "t", entry, "5:c:n")
    head = (
        stream,
        prefix,
        leases,
        _keys.group_name(service),
        await _xackdel(rr),
        _keys.dead_letter_stream(service),
        "_",
        3,
        "c",
    )
    go = ("t", entry, "5:c:n", ids[0], "go", "", "", "", 1, out, 2, "n", "0")
    for _ in range(2):
        (reply,) = await rr.eval(source("commit-1"), 1, *head, *go)
        assert reply == [1, 0, 0, b""]
    assert await rr.xlen(out) == 1
    fail = (
        "t",
        entry,
        "5:c:n",
        "",
        f"fail:0:1:{ids[1]}:10",
        '{"DataStreamName":"t","Info":{}}',
        "E: x",
        "",
        0,
    )
    (parked,) = await rr.eval(source("commit-1"), 1, *head, *fail)
    assert parked[0] == 6
    assert await rr.hget(_keys.key_state(service, "t"), "fails") == b"1"
    (again,) = await rr.eval(source("commit-1"), 1, *head, *fail)
    assert again == [2]  # the first let the key go: nothing counted twice
    assert await rr.hget(_keys.key_state(service, "t"), "fails") == b"1"


async def test_a_holder_that_died_counts_as_a_failed_hold_blamed_once_its_message_is_alone(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """fetch-1 after holders that died without a commit: the first death takes the batch apart (until,
    unblamed); each later death, with one message in hand, is blamed on it (a crash-looping poison
    reaches the limit); a live holder's second registration is neither."""
    from lbs._redis.scripts import source

    stream, prefix, leases, group = (
        _keys.input_stream(service),
        _keys.key_prefix(service),
        _keys.lease_prefix(service),
        _keys.group_name(service),
    )
    async with lbs.Publisher(url, service) as pub:
        ids = await pub.publish_many([("t", {"n": i}) for i in range(5)])
    await rr.xgroup_create(stream, group, id="0")
    registration = '{"DataStreamName":"t","Info":{}}'

    async def hold(token: int) -> tuple[str, list[Any]]:
        """Hold number ``token``: consumer c<token> reads the key's registration under its lease,
        fetches, and dies (its lease is gone; its entry stays pending to it)."""
        holder = f"c{token}"
        if token > 1:
            await rr.xadd(stream, {"lbs-input": registration, "lbs-keyed": "1"})
        ((_, ((entry, _),)),) = await rr.xreadgroup(group, holder, {stream: ">"}, count=1)
        entry = entry.decode()
        await rr.set(leases + holder, "n", px=60_000)
        (reply,) = await rr.eval(
            source("fetch-1"),
            1,
            stream,
            prefix,
            leases,
            3,
            group,
            "t",
            entry,
            f"{token}:{holder}:n",
        )
        await rr.delete(leases + holder)  # ... and the holder dies
        return entry, reply

    _, first = await hold(1)
    assert first == [1, 1, b"", 0, 0, b""]
    _, second = await hold(2)  # the first holder died with up to 3 messages: take them apart
    assert second == [1, 2, b"", 0, 1, ids[2].encode()]
    _, third = await hold(3)  # died with the first of them alone: blamed, with the batch's failure
    assert third == [1, 3, b"", 2, 0, ids[2].encode()]
    _, fourth = await hold(4)
    assert fourth == [1, 4, b"", 3, 0, ids[2].encode()]


async def test_a_key_whose_entry_moved_under_its_id_counts_the_death_against_its_message(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """An entry moved from a dead holder to the next with its id (XCLAIM, a new token; lbs's own
    recovery re-queues under a new id instead): fetch-1 counts the dead hold as failed, as it does
    under another entry, so a message whose holders keep dying reaches the limit alone; a fetch sent
    again under the same hold (its reply lost) counts nothing."""
    from lbs._redis.scripts import source

    stream, prefix, leases, group = (
        _keys.input_stream(service),
        _keys.key_prefix(service),
        _keys.lease_prefix(service),
        _keys.group_name(service),
    )
    async with lbs.Publisher(url, service) as pub:
        ids = await pub.publish_many([("t", {"n": i}) for i in range(5)])
    await rr.xgroup_create(stream, group, id="0")
    ((_, ((raw, _),)),) = await rr.xreadgroup(group, "c1", {stream: ">"}, count=1)
    entry = raw.decode()
    await rr.set(leases + "c1", "n", px=60_000)

    async def move(token: int) -> None:
        """Holder c<token - 1> dies (its lease is gone); its entry moves to c<token>, under its lease."""
        await rr.delete(leases + f"c{token - 1}")
        await rr.set(leases + f"c{token}", "n", px=60_000)
        await rr.xclaim(stream, group, f"c{token}", 0, [entry])

    async def fetch(token: int) -> list[Any]:
        (reply,) = await rr.eval(
            source("fetch-1"),
            1,
            stream,
            prefix,
            leases,
            3,
            group,
            "t",
            entry,
            f"{token}:c{token}:n",
        )
        assert reply[0] == 1, reply
        return list(reply[3:])  # fails, unblamed, until

    until = ids[2].encode()
    assert await fetch(1) == [0, 0, b""]
    # c1 died; the entry moves to c2 under token 2: c1 had up to 3 messages.
    await move(2)
    assert await fetch(2) == [0, 1, until]
    assert await fetch(2) == [0, 1, until]  # sent again: the same hold, nothing counted
    for token, fails in ((3, 2), (4, 3), (5, 4)):
        await move(token)
        # Died with the first message alone: blamed; at 1 + max_retries (3) the runner dead-letters it.
        assert await fetch(token) == [fails, 0, until]


async def test_a_handler_cut_short_by_close_counts_no_failure(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """close() cancels a running keyed handler (drain_timeout 0): its key is let go where it was, with
    nothing counted against its messages, and the next holder gets the whole batch as a first try."""
    started = asyncio.Event()

    async def stuck(batch: lbs.KeyedBatch) -> None:
        started.set()
        await asyncio.Event().wait()

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(5)])
    first = keyed_client(url, service, "c1", drain_timeout=0.0)
    runner = asyncio.create_task(first.run_keyed(stuck, batch=10))
    await asyncio.wait_for(started.wait(), 30)
    await first.close()
    await runner
    state = await rr.hgetall(_keys.key_state(service, "t"))
    assert not {b"holder", b"fails", b"unblamed", b"until"} & set(state)
    seen: list[tuple[int, list[int]]] = []

    async def handle(batch: lbs.KeyedBatch) -> None:
        seen.append((batch.retry_count, [int(m.fields["n"]) for m in batch.messages]))

    await drained(keyed_client(url, service, "c2"), handle, batch=10)
    assert seen == [(0, [0, 1, 2, 3, 4])]


async def test_status_shows_a_key_taken_apart_after_a_failure(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    gate = asyncio.Event()
    calls: list[int] = []

    async def handle(batch: lbs.KeyedBatch) -> None:
        calls.append(len(batch.messages))
        if len(calls) == 1:
            raise ValueError("once")
        await gate.wait()

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(3)])
    c = keyed_client(url, service, retry_delay=0.01, retry_delay_max=0.01)
    runner = asyncio.create_task(c.run_keyed(handle, batch=10))
    try:
        await eventually(lambda: _is(len(calls), 2), timeout=30)
        (key,) = (await collect_status(url, service)).keys
        assert (key.failures, key.isolating, calls) == (1, True, [3, 1])
        gate.set()
        await c.wait_finished(1, timeout=30)
    finally:
        gate.set()
        await c.close()
        await runner
    assert calls == [3, 1, 1, 1]


async def test_a_failed_key_comes_back_when_its_back_off_ends_not_at_the_idle_poll(
    url: str, service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner tells the delayed-retries task when it parks a failed key: with that task's idle
    poll an hour long, the key still comes back after its 10-20 ms back-off (it waited for the idle
    poll, 5 s by default, when the runner did not)."""
    from lbs._consumer import delays

    monkeypatch.setattr(delays, "IDLE_POLL", 3600.0)
    tries: list[int] = []

    async def handle(batch: lbs.KeyedBatch) -> None:
        tries.append(batch.retry_count)
        if len(tries) == 1:
            await asyncio.sleep(0.2)  # the task's first poll, which found nothing parked, is past
            raise ValueError("first try")

    async with lbs.Publisher(url, service) as pub:
        await pub.publish("k", {"n": 1})
    c = keyed_client(url, service, retry_delay=0.01, retry_delay_max=0.02)
    await drained(c, handle, batch=10)
    assert tries == [0, 1]
