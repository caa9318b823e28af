"""A sharded LBS: routing by name, every shard read, exactly once, spread over a cluster's masters."""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import lbs
from lbs.embedded import RedisClusterServers


def test_shard_names_and_routing_are_stable() -> None:
    assert lbs.shard_services("svc", 1) == ["svc"]  # one shard: the unsharded wire format
    assert lbs.shard_services("svc", 3) == [
        "svc.0~1339",
        "svc.1~1533",
        "svc.2~543",
    ]  # lbs._placement
    assert lbs.shard_of("session-42", 6) == zlib.crc32(b"session-42") % 6
    assert all(lbs.shard_of(f"n{i}", 1) == 0 for i in range(10))
    with pytest.raises(lbs.ConfigurationError, match="shards"):
        lbs.shard_services("svc", 0)


def _sharded(url: str, service: str, shards: int, **config: Any) -> lbs.ShardedClient:
    """The consumer "c" of every shard, without entry-point plugins."""
    cfg = lbs.Config(**{"read_block": 0.1, **config})
    return lbs.ShardedClient(url, service, "c", cfg, shards=shards, load_entrypoint_plugins=False)


async def _drain(client: lbs.ShardedClient, n: int, timeout: float = 20.0) -> Counter[str]:
    seen: Counter[str] = Counter()

    async def handle(note: lbs.Notification) -> None:
        seen[note.stream] += 1

    runner = asyncio.create_task(client.run(handle))
    try:

        async def finished() -> None:
            while sum(c.stats.finished for c in client.clients) < n:
                await asyncio.sleep(0.02)  # finished counts have no event to await across shards

        await asyncio.wait_for(finished(), timeout)
    finally:
        await client.close()
        await runner
    return seen


async def test_three_shards_on_one_redis(redis_server: Any, service: str, r: Any) -> None:
    names = [f"s{i}" for i in range(60)]
    async with lbs.Producer(redis_server.url, service, shards=3) as producer:
        await producer.add_streams(names)
    lengths = [await r.xlen(lbs.input_stream(svc)) for svc in lbs.shard_services(service, 3)]
    assert sum(lengths) == 60 and all(n > 0 for n in lengths)
    for i, svc in enumerate(lbs.shard_services(service, 3)):
        for _, fields in await r.xrange(lbs.input_stream(svc)):
            (name, _info, _) = lbs.try_decode_input(fields[b"lbs-input"])
            assert lbs.shard_of(name, 3) == i
    c = _sharded(redis_server.url, service, 3)
    seen = await _drain(c, 60)  # run() starts the shards' clients
    assert seen == Counter(dict.fromkeys(names, 1))
    for svc in lbs.shard_services(service, 3):
        assert await r.xlen(lbs.input_stream(svc)) == 0


def _owners(cluster: RedisClusterServers, service: str, shards: int) -> Counter[str]:
    """How many of the service's shards each master owns."""
    with cluster.client() as c:
        return Counter(
            c.get_node_from_key(lbs.input_stream(svc)).name
            for svc in lbs.shard_services(service, shards)
        )


def _evalsha_calls(cluster: RedisClusterServers) -> dict[str, int]:
    out = {}
    for node in cluster.masters:
        with redis.Redis(host=node.host, port=node.port) as r:
            stats = r.info("commandstats")
            out[f"{node.host}:{node.port}"] = int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return out


async def test_six_shards_on_three_masters_deliver_exactly_once_and_spread(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    # The test's own service name, not one chosen: every master gets two of the six (lbs._placement).
    assert sorted(_owners(redis_cluster, service, 6).values()) == [2, 2, 2]
    url = f"redis+cluster://{redis_cluster.nodes[0].host}:{redis_cluster.nodes[0].port}"
    names = [f"d{i}" for i in range(120)]
    before = _evalsha_calls(redis_cluster)
    async with lbs.Producer(url, service, shards=6) as producer:
        await producer.add_streams(names)
    slots = {key_slot(lbs.input_stream(svc).encode()) for svc in lbs.shard_services(service, 6)}
    assert len(slots) == 6
    c = _sharded(url, service, 6)
    seen = await _drain(c, 120)
    assert seen == Counter(dict.fromkeys(names, 1))
    assert len({sub.node for sub in c.clients}) == 3  # the shards' owners: every master
    after = _evalsha_calls(redis_cluster)
    assert all(
        after[node] > before[node] for node in after
    )  # reads and completions on every master


async def test_notifications_of_every_shard_and_done_in_the_right_one(
    redis_server: Any, service: str
) -> None:
    names = ["a", "b", "c", "d", "e", "f"]
    async with lbs.Producer(redis_server.url, service, shards=2) as producer:
        await producer.add_streams(names)
    assert {lbs.shard_of(n, 2) for n in names} == {0, 1}  # both shards hold work
    async with _sharded(redis_server.url, service, 2) as c:
        got = []
        async for note in c.notifications():
            if note.type is lbs.NotificationType.STREAM_ADDED:
                got.append(note.stream)
                assert await c.done_stream(note.stream) is lbs.DoneStatus.DONE
                if len(got) == len(names):
                    break
        assert sorted(got) == names and c.held == 0
        with pytest.raises(lbs.NotHeldError):
            await c.done_stream("a")


async def test_keyed_processing_with_six_shards_on_three_masters_keeps_each_keys_order(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    """Publisher(shards=6) and ShardedClient.run_keyed on a cluster: each key's four steps run in its
    shard's slot; every message is processed once, in its key's order; nothing is left behind."""
    assert sorted(_owners(redis_cluster, service, 6).values()) == [2, 2, 2]
    url = f"redis+cluster://{redis_cluster.nodes[0].host}:{redis_cluster.nodes[0].port}"
    keys, per_key = 36, 8
    seen: dict[str, list[int]] = {}
    async with lbs.Publisher(url, service, shards=6) as pub:
        await pub.publish_many(
            [(f"ticket-{k}", {"n": i}) for i in range(per_key) for k in range(keys)]
        )

    async def handle(batch: lbs.KeyedBatch) -> None:
        seen.setdefault(batch.key, []).extend(int(m.fields["n"]) for m in batch.messages)
        # An effect in the key's slot: the data stream's hash tag.
        batch.emit(batch.data_stream.partition("}:")[0] + "}:out", {"key": batch.key})

    c = _sharded(url, service, 6)
    runner = asyncio.create_task(c.run_keyed(handle, batch=3))
    try:

        async def finished() -> None:
            while sum(sub.stats.done for sub in c.clients) < keys:
                await asyncio.sleep(0.02)  # finished counts have no event to await across shards

        await asyncio.wait_for(finished(), 30)
    finally:
        await c.close()
        await runner
    assert seen == {f"ticket-{k}": list(range(per_key)) for k in range(keys)}
    assert len({sub.node for sub in c.clients}) == 3
    left: list[bytes] = []
    outs = 0
    for node in redis_cluster.masters:
        with redis.Redis(host=node.host, port=node.port) as r:
            for k in r.scan_iter(match=f"*{service}*", count=1000):
                if k.endswith(b"}:out"):
                    outs += r.xlen(k)
                    assert key_slot(k) in {
                        key_slot(lbs.input_stream(s).encode())
                        for s in lbs.shard_services(service, 6)
                    }
                elif b"}:k:" in k or b"}:m:" in k or k.startswith(b"lock:"):
                    left.append(k)
    assert left == [] and outs >= keys  # an effect per batch, at least one batch per key


async def test_shards_an_earlier_lbs_named_are_read_while_they_exist(
    redis_server: Any, service: str, r: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An upgrade: producers of an earlier lbs wrote shard i as ``<service>.i``; this lbs's consumers
    read those shards too (and say so), and the earlier shards of a layout being left as well."""
    from lbs._placement import legacy_names

    legacy, emptied = legacy_names(service, 2)  # the earlier names of the two shards
    await r.xadd(lbs.input_stream(legacy), {"lbs-input": lbs.encode_input("old-1")})
    # Deleted under a running consumer, which recreated it empty with its group: not read again.
    await r.xgroup_create(lbs.input_stream(emptied), f"{emptied}-group", id="0", mkstream=True)
    async with lbs.Producer(r, service, shards=3) as p3:  # a layout being left
        await p3.add_streams(["three-a", "three-b"])
    async with lbs.Producer(r, service, shards=2) as producer:
        await producer.add_streams(["new-1", "new-2"])
    c = lbs.ShardedClient(
        redis_server.url, service, "c", shards=2, previous_shards=[3], load_entrypoint_plugins=False
    )
    with caplog.at_level("WARNING", logger="lbs.sharding"):
        seen = await _drain(c, 5)
    assert seen == Counter(dict.fromkeys(["old-1", "three-a", "three-b", "new-1", "new-2"], 1))
    assert any(legacy in rec.getMessage() for rec in caplog.records)
    assert legacy in {x.service for x in c.clients} and emptied not in {
        x.service for x in c.clients
    }


def _in_shard(shard: int, shards: int, count: int) -> list[str]:
    """``count`` data stream names that all route to ``shard``."""
    return [
        n for n in (f"w{i}" for i in range(count * shards * 4)) if lbs.shard_of(n, shards) == shard
    ][:count]


async def _until(check: Any, what: str, timeout: float = 10.0) -> None:
    async def poll() -> None:
        while not (await check() if asyncio.iscoroutinefunction(check) else check()):
            await asyncio.sleep(0.01)  # what is polled (counts across shards, Redis) has no event

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"not within {timeout}s: {what}") from None


async def test_max_streams_is_the_processes_whichever_shard_holds_the_work(
    redis_server: Any, service: str
) -> None:
    # Every registration in one shard of four: the process takes max_streams of them, not a
    # quarter (each shard's reads ask for what the process has free), and never more.
    names = _in_shard(2, 4, 30)
    async with lbs.Producer(redis_server.url, service, shards=4) as producer:
        await producer.add_streams(names)
    async with _sharded(redis_server.url, service, 4, max_streams=8, read_block=0.2) as c:
        got: list[str] = []

        async def take() -> None:
            async for note in c.notifications():
                if note.type is lbs.NotificationType.STREAM_ADDED:
                    got.append(note.stream)

        taker = asyncio.create_task(take())
        try:
            await _until(lambda: len(got) == 8, "8 streams taken")
            await asyncio.sleep(0.6)  # every shard's reader has read again meanwhile
            assert c.held == 8 and len(got) == 8
            for stream in got[:3]:  # three slots free: three more come, from the same shard
                assert await c.done_stream(stream) is lbs.DoneStatus.DONE
            await _until(lambda: len(got) == 11, f"3 more taken ({c.held} held, {len(got)} taken)")
            await asyncio.sleep(0.6)
            assert c.held == 8 and len(got) == 11 and len(set(got)) == 11
        finally:
            taker.cancel()


async def test_run_concurrency_is_the_processes_over_every_shard(
    redis_server: Any, service: str
) -> None:
    # Work in one shard, then in every shard: run(concurrency=6) runs six handlers at once, never more.
    async with lbs.Producer(redis_server.url, service, shards=3) as producer:
        await producer.add_streams(_in_shard(0, 3, 10))
    release = asyncio.Event()
    running: set[str] = set()
    peak = 0
    finished = 0

    async def handle(note: lbs.Notification) -> None:
        nonlocal peak, finished
        running.add(note.stream)
        peak = max(peak, len(running))
        await release.wait()
        running.discard(note.stream)
        finished += 1

    c = _sharded(redis_server.url, service, 3, read_block=0.2)
    runner = asyncio.create_task(c.run(handle, concurrency=6))
    try:
        await _until(lambda: len(running) == 6, "six handlers running, all of one shard")
        async with lbs.Producer(redis_server.url, service, shards=3) as producer:
            await producer.add_streams([f"x{i}" for i in range(30)])
        await asyncio.sleep(0.6)  # every shard's reader has looked again
        assert peak == 6
        release.set()
        await _until(lambda: finished == 40, "all 40 handled", timeout=20.0)
        assert peak == 6
    finally:
        await c.close()
        await runner


async def test_a_waiting_read_that_finds_no_slot_free_puts_its_entry_back(
    redis_server: Any, service: str, r: Any
) -> None:
    # Two shards, one slot: both readers wait in Redis (a waiting read reserves no slot), one
    # registration comes to each; the second reply finds the slot taken and puts its entry back,
    # no retry counted, and it is taken once the slot frees.
    a, b = _in_shard(0, 2, 1)[0], _in_shard(1, 2, 1)[0]
    async with _sharded(redis_server.url, service, 2, max_streams=1, read_block=5.0) as c:

        async def both_wait() -> bool:
            reads = [cl for cl in await r.client_list() if cl["cmd"] == "xreadgroup"]
            return sum("b" in cl["flags"] for cl in reads) == 2

        await _until(both_wait, "both shards' readers waiting in Redis")
        async with lbs.Producer(redis_server.url, service, shards=2) as producer:
            ids = dict(zip([a, b], await producer.add_streams([a, b])))
        notes = c.notifications()
        first = await asyncio.wait_for(anext(notes), 10.0)
        assert first.type is lbs.NotificationType.STREAM_ADDED and first.stream in (a, b)
        other = b if first.stream == a else a
        shard = lbs.shard_services(service, 2)[lbs.shard_of(other, 2)]

        async def put_back() -> bool:  # read, then back as a new entry: none pending in its shard
            pending = (await r.xpending(lbs.input_stream(shard), f"{shard}-group"))["pending"]
            return not pending and [i for i, _ in await r.xrange(lbs.input_stream(shard))] not in (
                [],
                [ids[other].encode()],
            )

        await _until(put_back, "the entry no slot was free for put back")
        assert c.held == 1
        assert await c.done_stream(first.stream) is lbs.DoneStatus.DONE
        second = await asyncio.wait_for(anext(notes), 10.0)
        assert (second.type, second.stream, second.retry_count) == (
            lbs.NotificationType.STREAM_ADDED,
            other,
            0,
        )
