"""Retries with back-off: a failed stream is parked in Redis and comes back after its delay.

Every timing claim is checked against the server's clock only: a parked
copy's delay is its due score minus its parked id's milliseconds (both
written by one script), and "not before its delay" is checked on snapshots
that read TIME and the due index in one MULTI, so no client clock and no
millisecond slack is involved.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

import lbs
from lbs._keys import delayed_stream, due_key
from lbs.embedded import RedisClusterServers
from lbs.testing import probe

from _helpers import client, eventually, is_true, produce, take

pytestmark = pytest.mark.timeout(90)


def ms_of(entry_id: str | bytes) -> int:
    """The milliseconds part of a stream id: the server's clock when it was added."""
    return int((entry_id.decode() if isinstance(entry_id, bytes) else entry_id).split("-")[0])


async def server_ms(r: aioredis.Redis) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def parked_delay(r: aioredis.Redis, service: str, parked_id: str) -> int:
    """How long a parked copy waits (ms): its due score minus the server time it was parked at."""
    score = await r.zscore(due_key(service), parked_id)
    assert score is not None, f"{parked_id} is not in the due index"
    return int(score) - ms_of(parked_id)


class HandBacks:
    """A plugin: every hand-back's (stream, new or parked id, retry counted), in a queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[str, str, bool]] = asyncio.Queue()

    @lbs.hookimpl
    def lbs_stream_handed_back(self, stream: str, new_entry_id: str, retry_counted: bool) -> None:
        self.queue.put_nowait((stream, new_entry_id, retry_counted))

    async def next(self, timeout: float = 10.0) -> tuple[str, str, bool]:
        return await asyncio.wait_for(self.queue.get(), timeout)


async def stop_promoting(c: lbs.Client) -> None:
    """Stop this client's promotion task: only what the test does (or another client) brings parked work back."""
    await probe(c).delays.stop()


async def run_without_promoting(c: lbs.Client, handler: Any) -> asyncio.Task[None]:
    """``c.run(handler)`` in a task, its promotion task stopped once it has started (produce after this)."""
    runner = asyncio.create_task(c.run(handler))
    await eventually(lambda: is_true(probe(c).delays.task is not None))
    await stop_promoting(c)
    return runner


async def test_a_failed_stream_comes_back_after_its_delay_and_not_before(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "flaky")
    watch = HandBacks()
    c = client(any_server.url, service, plugins=[watch], retry_delay=1.0)
    again: asyncio.Future[tuple[lbs.Notification, int]] = asyncio.get_running_loop().create_future()

    async def handler(note: lbs.Notification) -> None:
        if note.retry_count == 0:
            raise RuntimeError("first attempt fails")
        if not again.done():
            again.set_result((note, await server_ms(rr)))

    runner = asyncio.create_task(c.run(handler))
    try:
        stream, parked_id, counted = await watch.next()
        assert (stream, counted) == ("flaky", True)
        # Retry 1: d = 1000 ms, jittered in [500, 1000].
        delay = await parked_delay(rr, service, parked_id)
        assert 500 <= delay <= 1000
        due = ms_of(parked_id) + delay
        assert await rr.xrange(delayed_stream(service), parked_id, parked_id)

        # Until it is back, every snapshot taken before its due time finds it parked.
        async def back() -> bool:
            async with rr.pipeline(transaction=True) as pipe:
                now, score, copies = (
                    await pipe.time()
                    .zscore(due_key(service), parked_id)
                    .xrange(delayed_stream(service), parked_id, parked_id)
                    .execute()
                )
            now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
            if now_ms < due:
                assert score == due and copies, "a parked copy left before its due time"
            return score is None

        await eventually(back, timeout=20)
        note, seen_at = await asyncio.wait_for(again, 20)
        assert seen_at >= due  # the server's clock, when the handler saw it again
        assert (note.stream, note.retry_count) == ("flaky", 1)
        assert (
            c.stats.handler_failures == 1
            and c.stats.retries_delayed == 1
            and c.stats.handed_back == 1
        )
        await c.wait_finished(1, timeout=10)
        assert await rr.xlen(delayed_stream(service)) == 0 and not await rr.exists(due_key(service))
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)


async def test_the_delay_doubles_per_retry_then_the_stream_is_dead_lettered(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    watch = HandBacks()
    c = client(
        any_server.url,
        service,
        plugins=[watch],
        retry_delay=0.1,
        retry_delay_max=0.3,
        max_retries=4,
    )
    attempts: list[int] = []

    async def handler(note: lbs.Notification) -> None:
        attempts.append(note.retry_count)
        raise RuntimeError("always fails")

    runner = await run_without_promoting(
        c, handler
    )  # this test promotes by hand, after reading each due score
    try:
        await produce(any_server.url, service, "poison")
        delays = []
        for _ in range(4):
            _, parked_id, _ = await watch.next()
            delays.append(await parked_delay(rr, service, parked_id))
            due = await rr.zscore(due_key(service), parked_id)
            assert due is not None
            while await server_ms(rr) < due:
                await asyncio.sleep(0.01)
            assert (await probe(c).delays.promote())[0] == 1
        # Retries 1..4: d = 100, 200, 300 (capped), 300 ms, each jittered in [d/2, d].
        for delay, d in zip(delays, (100, 200, 300, 300)):
            assert d / 2 <= delay <= d, delays
        # Retry 5 is past max_retries: dead-lettered at once, not parked.
        await eventually(lambda: is_true(c.stats.dead_lettered == 1))
        assert attempts == [0, 1, 2, 3, 4]
        ((_dl_id, dl),) = await rr.xrange(lbs.dead_letter_stream(service))
        assert dl[b"_retry_count"] == b"5" and b"always fails" in dl[b"_reason"]
        assert await rr.xlen(delayed_stream(service)) == 0 and not await rr.exists(due_key(service))
        assert c.stats.retries_delayed == 4 and c.stats.handler_failures == 5
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)


async def test_a_parked_stream_survives_a_restart(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    watch = HandBacks()
    first = client(any_server.url, service, "c1", plugins=[watch], retry_delay=0.2)

    async def fail(note: lbs.Notification) -> None:
        raise RuntimeError("fails before the restart")

    runner = await run_without_promoting(
        first, fail
    )  # so the copy is still parked when this client is gone
    await produce(any_server.url, service, "flaky")
    _, parked_id, _ = await watch.next()
    await first.close()
    await asyncio.wait_for(runner, 10)
    assert await rr.xrange(delayed_stream(service), parked_id, parked_id)
    assert await rr.zscore(due_key(service), parked_id) is not None

    second = client(any_server.url, service, "c1", retry_delay=0.2)
    await second.start()
    try:
        (note,) = await take(second, 1, timeout=20)
        assert (note.stream, note.retry_count) == ("flaky", 1)
        assert await second.done_stream(note.stream) is lbs.DoneStatus.DONE
        assert await rr.xlen(delayed_stream(service)) == 0 and not await rr.exists(due_key(service))
        assert await rr.xlen(lbs.input_stream(service)) == 0
    finally:
        await second.close()


async def test_two_clients_promoting_at_once_bring_each_stream_back_once(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    names = [f"s{i}" for i in range(40)]
    await produce(any_server.url, service, *names)
    seen: Counter[tuple[str, int]] = Counter()

    async def handler(note: lbs.Notification) -> None:
        seen[note.stream, note.retry_count] += 1
        if note.retry_count == 0:
            raise RuntimeError("first attempt fails")

    clients = [client(any_server.url, service, f"c{i}", retry_delay=0.1) for i in range(2)]
    runners = [asyncio.create_task(c.run(handler)) for c in clients]
    try:
        await eventually(
            lambda: is_true(sum(c.stats.finished for c in clients) == len(names)), timeout=30
        )
        # Both clients' promoters ran over the same due index the whole time; once more, at once, by hand.
        await asyncio.gather(*(probe(c).delays.promote() for c in clients))
        # A duplicate would be an entry left in the LBS (read or not: entries stay until done) or a third call.
        assert seen == Counter({(n, r): 1 for n in names for r in (0, 1)})
        assert sum(c.stats.retries_delayed for c in clients) == len(names)
        assert await rr.xlen(lbs.input_stream(service)) == 0
        assert await rr.xlen(delayed_stream(service)) == 0 and not await rr.exists(due_key(service))
    finally:
        await asyncio.gather(*(c.close() for c in clients))
        await asyncio.wait_for(asyncio.gather(*runners), 10)


async def test_concurrent_promote_calls_move_each_copy_once(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    names = [f"s{i}" for i in range(30)]
    await produce(any_server.url, service, *names)
    c = client(any_server.url, service, retry_delay=0.05, max_streams=30)
    others = [client(any_server.url, service, f"p{i}") for i in range(3)]
    await c.start()
    await stop_promoting(c)
    notes = await take(c, len(names))
    for note in notes:
        assert await c.hand_back(note.stream, count_retry=True)
    assert await rr.zcard(due_key(service)) == len(names)
    last = max(s for _, s in await rr.zrange(due_key(service), 0, -1, withscores=True))
    while await server_ms(rr) < last:
        await asyncio.sleep(0.01)
    try:
        # Clients that never start (no reader, no promoter of their own): only these calls promote.
        results = await asyncio.gather(
            *(probe(p).delays.promote() for p in others for _ in range(3))
        )
        assert sum(moved for moved, _ in results) == len(names)
        entries = await rr.xrange(lbs.input_stream(service))
        assert sorted(lbs.decode_input(f[b"lbs-input"])[0] for _, f in entries) == sorted(names)
        assert await rr.xlen(delayed_stream(service)) == 0 and not await rr.exists(due_key(service))
    finally:
        await c.close()
        for p in others:
            await p.close()


@pytest.mark.parametrize("where", ["run", "config"])
async def test_a_handler_past_its_timeout_is_cancelled_and_counted(
    any_server: Any, service: str, rr: aioredis.Redis, where: str
) -> None:
    await produce(any_server.url, service, "slow")
    watch = HandBacks()
    config: dict[str, Any] = {"handler_timeout": 0.2} if where == "config" else {}
    c = client(any_server.url, service, plugins=[watch], retry_delay=0.05, **config)
    cancelled = asyncio.Event()
    done = asyncio.Event()

    async def handler(note: lbs.Notification) -> None:
        if note.retry_count == 0:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise
        done.set()

    runner = asyncio.create_task(c.run(handler, timeout=0.2 if where == "run" else None))
    try:
        await asyncio.wait_for(cancelled.wait(), 10)
        _, parked_id, counted = await watch.next()
        assert counted and parked_id
        await asyncio.wait_for(done.wait(), 20)
        await c.wait_finished(1, timeout=10)
        stats = c.stats
        assert (stats.handler_timeouts, stats.handler_failures, stats.retries_delayed) == (1, 0, 1)
        assert stats.handler_seconds.count == 2
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)


async def test_a_timed_out_stream_past_max_retries_is_dead_lettered_with_the_reason(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "stuck")
    c = client(any_server.url, service, max_retries=0)

    async def handler(note: lbs.Notification) -> None:
        await asyncio.sleep(3600)

    runner = asyncio.create_task(c.run(handler, timeout=0.1))
    try:
        await eventually(lambda: is_true(c.stats.dead_lettered == 1))
        ((_, dl),) = await rr.xrange(lbs.dead_letter_stream(service))
        assert dl[b"_reason"] == b"handler timed out after 0.1s"
        assert c.stats.handler_timeouts == 1 and c.stats.retries_delayed == 0
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)


async def test_hand_back_delay(any_server: Any, service: str, rr: aioredis.Redis) -> None:
    await produce(any_server.url, service, "now", "counted", "later", "counted-now", "block")
    c = client(any_server.url, service, retry_delay=30.0, retry_delay_max=60.0)
    await c.start()
    await stop_promoting(c)
    try:
        notes = {n.stream: n for n in await take(c, 5)}
        # No retry counted, no delay: at once, as before.
        new_id = await c.hand_back("now")
        assert ms_of(new_id) and await rr.xrange(lbs.input_stream(service), new_id, new_id)
        # A retry counted: the back-off (retry 1 of 30 s: 15 to 30 s).
        parked = await c.hand_back("counted", count_retry=True)
        assert 15_000 <= await parked_delay(rr, service, parked) <= 30_000
        # An explicit delay: exactly that long, retry counted or not.
        parked = await c.hand_back("later", delay=5)
        assert await parked_delay(rr, service, parked) == 5_000
        ((_, fields),) = await rr.xrange(delayed_stream(service), parked, parked)
        assert fields[b"_retry_count"] == b"0"
        # delay=0: at once, even with a retry counted.
        new_id = await c.hand_back("counted-now", count_retry=True, delay=0)
        ((_, fields),) = await rr.xrange(lbs.input_stream(service), new_id, new_id)
        assert fields[b"_retry_count"] == b"1"
        assert c.stats.retries_delayed == 2 and c.stats.handed_back == 4
        for bad in (-1, float("nan"), float("inf"), "5", True):
            with pytest.raises(lbs.ConfigurationError):
                await c.hand_back("block", delay=bad)  # type: ignore[arg-type]
        assert notes["block"].stream in [h.stream for h in c.held_streams()]
    finally:
        await c.close()


async def test_leaving_a_notification_block_with_an_error_gets_the_back_off(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "a")
    c = client(any_server.url, service, retry_delay=30.0)
    await c.start()
    await stop_promoting(c)
    try:
        (note,) = await take(c, 1)
        with pytest.raises(RuntimeError):
            async with note:
                raise RuntimeError("boom")
        ((parked_id, fields),) = await rr.xrange(delayed_stream(service))
        assert fields[b"_retry_count"] == b"1"
        assert 15_000 <= await parked_delay(rr, service, parked_id.decode()) <= 30_000
    finally:
        await c.close()


async def test_close_hands_back_at_once_without_a_retry(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "busy")
    started = asyncio.Event()

    async def handler(note: lbs.Notification) -> None:
        started.set()
        await asyncio.sleep(3600)

    c = client(any_server.url, service, retry_delay=30.0, drain_timeout=0)
    runner = asyncio.create_task(c.run(handler))
    await asyncio.wait_for(started.wait(), 10)
    await c.close()
    await asyncio.wait_for(runner, 10)
    ((_, fields),) = await rr.xrange(lbs.input_stream(service))
    assert fields.get(b"_retry_count", b"0") == b"0"
    assert not await rr.exists(delayed_stream(service), due_key(service))
    assert c.stats.retries_delayed == 0 and c.stats.handler_failures == 0


@pytest.mark.cluster
async def test_on_a_cluster_the_parked_keys_share_the_lbs_slot(
    redis_cluster: RedisClusterServers, service: str
) -> None:
    slots = {
        key_slot(k.encode())
        for k in (lbs.input_stream(service), delayed_stream(service), due_key(service))
    }
    assert len(slots) == 1
    host, port = redis_cluster.masters[0].host, redis_cluster.masters[0].port
    rc = RedisCluster(host=host, port=port)
    c = client(rc, service, retry_delay=0.1)
    again = asyncio.Event()

    async def handler(note: lbs.Notification) -> None:
        if note.retry_count == 0:
            raise RuntimeError("first attempt fails")
        again.set()

    runner = asyncio.create_task(c.run(handler))
    try:
        async with lbs.Producer(rc, service) as producer:
            await producer.add_stream("x")
        await asyncio.wait_for(again.wait(), 20)
        await c.wait_finished(1, timeout=10)
        assert c.stats.retries_delayed == 1
        assert await rc.xlen(delayed_stream(service)) == 0 and not await rc.exists(due_key(service))
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)
        await rc.aclose()


async def test_a_due_index_of_the_wrong_type_loses_nothing(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    # The park is refused with nothing written (the script's precondition), and the
    # client re-queues the stream at once instead of leaving it pending.
    await rr.set(due_key(service), "not a sorted set")
    await produce(any_server.url, service, "flaky")
    seen: list[int] = []
    again = asyncio.Event()

    async def handler(note: lbs.Notification) -> None:
        seen.append(note.retry_count)
        if note.retry_count == 0:
            raise RuntimeError("first attempt fails")
        again.set()

    c = client(any_server.url, service, retry_delay=0.1)
    runner = asyncio.create_task(c.run(handler))
    try:
        await asyncio.wait_for(again.wait(), 20)
        await c.wait_finished(1, timeout=10)
        assert seen == [0, 1] and c.stats.retries_delayed == 0 and c.stats.handed_back == 1
        assert c.metrics.get("wrong_type_keys_total", 0) >= 1
        assert await rr.get(due_key(service)) == b"not a sorted set"
        assert not await rr.exists(delayed_stream(service))
        assert await rr.xlen(lbs.input_stream(service)) == 0
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)


async def test_a_handler_failure_is_logged_with_its_traceback(
    redis_server: Any, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    await produce(redis_server.url, service, "bad-1")
    c = client(redis_server.url, service, retry_delay=0.0, max_retries=0)

    async def handler(note: lbs.Notification) -> None:
        raise RuntimeError(f"cannot process {note.stream}")

    task = asyncio.create_task(c.run(handler, handle_signals=False))
    try:
        await eventually(lambda: is_true(c.stats.dead_lettered == 1), timeout=30)
    finally:
        await c.close()
        await task
    (record,) = [r for r in caplog.records if "handler failed on bad-1" in r.getMessage()]
    assert "RuntimeError: cannot process bad-1" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is not None
    assert "cannot process bad-1" in str(record.exc_info[1])
