"""Keyed, ordered processing on a real server: Publisher -> run_keyed -> commit, fenced, let go when drained."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
import redis.asyncio as aioredis
from _helpers import eventually

import lbs
from lbs import _keys
from lbs.status import collect_status

pytestmark = pytest.mark.timeout(120)

@pytest.fixture
def url(any_server: Any) -> str:
    """Each test runs on Redis 8.x, then on Debian's 7.0."""
    return str(any_server.url)


CFG = dict(read_block=0.05, configure_keyspace_events=False, lock_ttl=2.0)


def keyed_client(url: str, service: str, consumer: str = "c1", **kw: Any) -> lbs.Client:
    return lbs.Client(url, service, consumer_id=consumer, config=lbs.Config(**{**CFG, **kw}),
                      load_entrypoint_plugins=False)


async def leftovers(r: aioredis.Redis, service: str) -> list[bytes]:
    """Keys of the service besides the LBS and the bookkeeping every consumer keeps."""
    tag = _keys.hash_tag(service)
    found = [k async for k in r.scan_iter(match=f"*{tag}*")]
    return sorted(k for k in found if k.decode().startswith((f"{tag}:k:", f"{tag}:m:", f"lock:{tag}")))


async def test_messages_of_each_key_are_processed_in_order_and_leave_nothing(url: str, service: str,
                                                                                rr: aioredis.Redis) -> None:
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
    assert {k: v for k, v in seen.items()} == {f"t{k}": list(range(20)) for k in range(5)}
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
        url: str, service: str, rr: aioredis.Redis) -> None:
    """A short batch commits with "last:<n>" (nothing read behind it): what came meanwhile is in the
    commit's reply, handed over in order in the same hold, and the key is let go once drained."""
    seen: list[tuple[int, list[int]]] = []
    c = keyed_client(url, service)
    async with lbs.Publisher(url, service) as pub:
        await pub.publish("t", {"n": 0})

        async def handle(batch: lbs.KeyedBatch) -> None:
            seen.append((batch.token, [int(m.fields["n"]) for m in batch.messages]))
            if len(seen) < 3:  # two more arrive while this batch is processed
                await pub.publish_many([("t", {"n": 2 * len(seen) - 1}), ("t", {"n": 2 * len(seen)})])

        runner = asyncio.create_task(c.run_keyed(handle, batch=5))
        await eventually(lambda: _released(c, 1))
    await c.close()
    await runner
    assert [ns for _, ns in seen] == [[0], [1, 2], [3, 4]]
    assert len({token for token, _ in seen}) == 1  # one hold: the commits went on
    assert await rr.xlen(_keys.input_stream(service)) == 0 and await leftovers(rr, service) == []


async def test_a_key_is_registered_once_while_registered(url: str, service: str, rr: aioredis.Redis) -> None:
    async with lbs.Publisher(url, service) as pub:
        await pub.publish("t1", {"n": 1})
        await pub.publish("t1", {"n": 2})
        await pub.publish_many([("t1", {"n": 3}), ("t2", {"n": 1})])
    assert await rr.xlen(_keys.input_stream(service)) == 2  # t1 and t2, once each
    assert await rr.xlen(_keys.keyed_stream(service, "t1")) == 3


async def test_a_message_published_while_the_holder_lets_go_is_never_stranded(url: str, service: str,
                                                                               rr: aioredis.Redis) -> None:
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
        url: str, service: str, rr: aioredis.Redis) -> None:
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
        url: str, service: str, rr: aioredis.Redis) -> None:
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
    assert not {"_reason", "_key", "_failed_id", "_retry_count"} & set(fields)
    assert await leftovers(rr, service) == []


async def _xackdel(r: aioredis.Redis) -> int:
    """commit-1.lua's ARGV[4] for this server: 1 where XACKDEL exists (Redis >= 8.2)."""
    version = tuple(int(x) for x in (await r.info("server"))["redis_version"].split(".")[:2])
    return 1 if version >= (8, 2) else 0


async def test_a_zombie_holder_cannot_commit(url: str, service: str, rr: aioredis.Redis) -> None:
    """A holder whose lock expired (stalled past its TTL) is refused; the new holder resumes at the position."""
    from lbs._redis.scripts import source

    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("t", {"n": i}) for i in range(3)])
    stream, prefix = _keys.input_stream(service), _keys.key_prefix(service)
    lock_prefix = _keys.lock_key(service, "")
    await rr.xgroup_create(stream, _keys.group_name(service), id="0")
    ((_, ((entry, _),)),) = await rr.xreadgroup(_keys.group_name(service), "zombie", {stream: ">"})
    entry = entry.decode()
    await rr.set(lock_prefix + entry, "7:zombie", px=60_000)
    (ours,) = await rr.eval(source("fetch-1"), 1, stream, prefix, lock_prefix, "t", entry, "7:zombie")
    assert ours == [1, 1, b""]  # ours, first try, nothing committed yet
    first = (await rr.xrange(_keys.keyed_stream(service, "t"), count=1))[0][0].decode()
    await rr.delete(lock_prefix + entry)  # the lock expired: the zombie's hold is over
    (refused,) = await rr.eval(source("commit-1"), 1, stream, prefix, lock_prefix, _keys.group_name(service),
                              await _xackdel(rr),
                              _keys.dead_letter_stream(service), "_", "t", entry, "7:zombie", first, "go", "{}", "")
    assert refused == [2]
    assert await rr.hget(_keys.key_state(service, "t"), "pos") is None  # the position never moved
    assert await rr.xlen(_keys.keyed_stream(service, "t")) == 3


async def test_status_lists_held_keys_with_backlog_and_position(url: str, service: str, rr: aioredis.Redis) -> None:
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
    assert (key.key, key.consumer, key.backlog, key.tries, key.holder) == ("busy", "redis-consumer-c1", 3, 1, True)
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
        url: str, service: str, rr: aioredis.Redis) -> None:
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

        await eventually(is_parked)  # parked for 1-2 s (jittered): the key is out of the LBS meanwhile
        (parked_id, fields), = await rr.xrange(parked)
        assert fields[b"lbs-keyed"] == b"1" and await rr.zcard(_keys.due_key(service)) == 1
        await pub.publish("t", {"n": 2})  # a registration in force: parked, so no new one
        assert await rr.xlen(_keys.input_stream(service)) == 0
        assert await rr.hget(_keys.key_state(service, "t"), "reg") == parked_id
    await eventually(lambda: _released(c, 1), timeout=30)
    await c.close()
    await runner
    assert seen == [["0", "1"], ["0"], ["1", "2"]]  # the retry one message at a time, then on
    assert await leftovers(rr, service) == []


async def test_a_server_that_lost_its_scripts_gets_them_again(url: str, service: str, rr: aioredis.Redis,
                                                               any_server: Any) -> None:
    """A restart or a failover empties the script cache: the commit that meets NOSCRIPT loads the
    scripts and goes again (its effects are written twice: IDMP keeps one on 8.6)."""
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
    effects = [f[b"n"].decode() for _, f in await rr.xrange(out)]
    # The first batch's effects went out twice: IDMP (8.6) keeps one; before, at least once.
    assert effects == (["0", "1", "2", "3"] if any_server.version >= (8, 6) else ["0", "1", "0", "1", "2", "3"])


async def test_a_hot_key_yields_after_max_hold_messages_so_others_are_not_starved(
        url: str, service: str, rr: aioredis.Redis) -> None:
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
        url: str, service: str, rr: aioredis.Redis) -> None:
    """fetch-1 and commit-1 on a batch where one key's state or data stream is garbage: that key is
    refused with nothing of it written, the other key of the same call goes through."""
    from lbs._redis.scripts import source

    stream, prefix, lock_prefix = _keys.input_stream(service), _keys.key_prefix(service), _keys.lock_key(service, "")
    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("good", {"n": 1}), ("bad", {"n": 1})])
    await rr.xgroup_create(stream, _keys.group_name(service), id="0")
    ((_, entries),) = await rr.xreadgroup(_keys.group_name(service), "c", {stream: ">"})
    (good, _), (bad, _) = [(e.decode(), f) for e, f in entries]
    for entry in (good, bad):
        await rr.set(lock_prefix + entry, "5:c", px=60_000)
    await rr.delete(_keys.key_state(service, "bad"))
    await rr.rpush(_keys.key_state(service, "bad"), "garbage")
    out = await rr.eval(source("fetch-1"), 1, stream, prefix, lock_prefix, "good", good, "5:c", "bad", bad, "5:c")
    assert out[0][0] == 1 and out[1] == [4, f"{_keys.key_state(service, 'bad')} holds a list".encode()]
    assert await rr.lrange(_keys.key_state(service, "bad"), 0, -1) == [b"garbage"]
    # The good key's data stream turns to garbage before its commit: refused, nothing of it written.
    first = (await rr.xrange(_keys.keyed_stream(service, "good")))[0][0].decode()
    await rr.delete(_keys.keyed_stream(service, "good"))
    await rr.rpush(_keys.keyed_stream(service, "good"), "garbage")
    before = await rr.hgetall(_keys.key_state(service, "good"))
    (refused,) = await rr.eval(source("commit-1"), 1, stream, prefix, lock_prefix, _keys.group_name(service),
                              await _xackdel(rr),
                               _keys.dead_letter_stream(service), "_", "good", good, "5:c", first, "go", "{}", "")
    assert refused == [2]
    assert await rr.hgetall(_keys.key_state(service, "good")) == before
    assert await rr.get(lock_prefix + good) == b"5:c"
