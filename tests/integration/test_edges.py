"""The consumer's edges: dropped connections, duplicate ids, leaked holds, shutdown.

Each test here reproduces a finding of issue 16 on a real server and failed
before its fix.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

import lbs
from lbs import _keys
from lbs.testing import probe

from _helpers import client, eventually, is_true, produce, take


async def _kill_clients_of(r: aioredis.Redis, c: lbs.Client) -> int:
    """CLIENT KILL every connection of ``c`` (they carry redis-py's lib-name; ours is SKIPME)."""
    me = await r.client_id()
    killed = 0
    for info in await r.client_list():
        if int(info["id"]) != me and info.get("cmd") not in ("client|list", "client|kill"):
            killed += int(await r.execute_command("CLIENT", "KILL", "ID", info["id"]))
    return killed


async def test_one_dropped_connection_robs_nothing(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # Finding 1: hold 10 streams, kill the consumer's connections once after
    # its first heartbeat. The next tick must not fail on the dead connection
    # (the Wire notices the EOF and reconnects), so the lease never expires.
    await produce(redis_server.url, service, *[f"s{i}" for i in range(10)])
    c = client(redis_server.url, service, lock_ttl=1.5, recovery=False)
    ticks: list[int] = []

    class CountTicks:
        @lbs.hookimpl
        def lbs_locks_extended(self, extended: int, lost: int) -> None:
            ticks.append(lost)

    c.pm.register(CountTicks())
    await c.start()
    try:
        notes = await take(c, 10)
        await eventually(lambda: is_true(len(ticks) >= 1))
        assert await _kill_clients_of(r, c) >= 1
        # Two TTLs: the lease would have expired without a working heartbeat.
        await eventually(lambda: is_true(len(ticks) >= 1 + 6), timeout=20)
        assert c.held == 10 and sum(ticks) == 0
        assert c.drain_notifications() == []  # no STREAM_DISOWNED
        statuses = await c.done_streams(notes)
        assert statuses == [lbs.DoneStatus.DONE] * 10
    finally:
        await c.close()


async def test_a_done_batch_whose_connection_dies_in_flight_is_retried(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # A done call whose connection fails after it was sent is sent once more
    # on a fresh connection; an entry the first call finished reads DONE
    # (done-n.lua's "already done" on a retry), not LOCK_LOST.
    await produce(redis_server.url, service, "a", "b")
    c = client(redis_server.url, service, recovery=False)
    await c.start()
    try:
        notes = await take(c, 2)
        wire = probe(c).link.done
        real = wire._stream
        calls = 0

        async def run_then_drop(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            replies = await real(*args, **kwargs)
            if calls == 1:  # the call ran on the server; its reply is "lost"
                await wire._conn.disconnect()
                raise RedisConnectionError("connection closed by the server")
            return replies

        wire._stream = run_then_drop  # type: ignore[method-assign]
        assert await c.done_streams(notes) == [lbs.DoneStatus.DONE, lbs.DoneStatus.DONE]
        assert calls == 2
        assert await r.xlen(lbs.input_stream(service)) == 0
        assert c.stats.done == 2 and c.stats.lock_lost == 0
    finally:
        await c.close()


async def test_a_second_process_with_the_same_consumer_id_is_refused(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # Finding 4: two processes under one consumer id would share a pending
    # list and one lease. The second is refused at start.
    await produce(redis_server.url, service, "a")
    first = client(redis_server.url, service, consumer="dup", lock_ttl=1.0)
    second = client(redis_server.url, service, consumer="dup", lock_ttl=1.0)
    await first.start()
    try:
        (note,) = await take(first, 1)
        with pytest.raises(lbs.ConfigurationError, match="in use by another live process"):
            await second.start()
        assert first.held == 1 and await first.done_stream(note.stream) is lbs.DoneStatus.DONE
    finally:
        await first.close()
        await second.close()
    # Closed, the id is free again at once (the lease was deleted, not left to expire).
    assert await r.exists(_keys.lease_key(service, first.id)) == 0
    third = client(redis_server.url, service, consumer="dup", lock_ttl=1.0)
    await asyncio.wait_for(third.start(), 0.9)
    await third.close()


async def test_a_second_process_that_takes_a_lost_lease_over_leaves_the_first_nothing(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # A process whose read reply was lost re-reads its consumer's pending
    # entries and takes them again: they are held by the consumer's lease. Another
    # process with the same id (the first one's lease lost, so not refused)
    # takes the lease, and with it everything pending to the consumer: the
    # first can neither keep nor finish any of it, so each is finished once.
    await produce(redis_server.url, service, "a", "b", "c")
    first = client(redis_server.url, service, consumer="same", recovery=False)
    await first.start()
    second = client(redis_server.url, service, consumer="same", recovery=False)
    try:
        notes = await take(first, 3)
        await r.delete(_keys.lease_key(service, first.id))
        probe(second).lose_read_reply()  # its first read re-reads the pending list ("0")
        await second.start()
        again = await take(second, 3)
        assert {n.entry_id for n in again} == {n.entry_id for n in notes}
        # The first's tick finds the lease another process's: it loses all and takes nothing back.
        assert await first.heartbeat() == 3
        assert first.held == 0
        assert await r.get(second.lease_key) == second.instance.encode()
        assert [await first.done_stream(n.stream) for n in notes] == [lbs.DoneStatus.LOCK_LOST] * 3
        assert [await second.done_stream(n.stream) for n in again] == [lbs.DoneStatus.DONE] * 3
        stream, group = lbs.input_stream(service), lbs.group_name(service)
        assert (await r.xpending(stream, group))["pending"] == 0 and await r.xlen(stream) == 0
    finally:
        await second.close()
        await first.close()


async def test_a_second_process_that_takes_a_lost_lease_over_gets_tokens_of_its_own(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # As above: the first process still believes it holds its streams until its next tick, and
    # may write with their tokens meanwhile. The second's tokens must fence those writes off.
    await produce(redis_server.url, service, "a", "b", "c")
    first = client(redis_server.url, service, consumer="same", recovery=False)
    await first.start()
    second = client(redis_server.url, service, consumer="same", recovery=False)
    try:
        notes = await take(first, 3)
        await r.delete(_keys.lease_key(service, first.id))
        probe(second).lose_read_reply()  # its first read re-reads the pending list ("0")
        await second.start()
        again = await take(second, 3)
        assert {n.entry_id for n in again} == {n.entry_id for n in notes}
        assert all(n.token > max(m.token for m in notes) for n in again), (
            [n.token for n in notes],
            [n.token for n in again],
        )
    finally:
        await second.close()
        await first.close()


async def test_a_re_read_after_a_lost_reply_leaves_a_stream_being_handed_back_alone(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # A handler failed and its hand-back waits for Redis (a restart's LOADING, a slow link) while the
    # reader, its last reply lost, re-reads the pending list: the entry is still pending under our lease,
    # but it is no longer held. Taking it again ran the failed handler a second time and then made
    # the hand-back fail ("lock") - the fault suite's loading test saw exactly that; and the re-read
    # (XREADGROUP's history) counted a delivery, which the re-queue took for a holder's death.
    runs: list[tuple[str, int]] = []

    async def handler(note: lbs.Notification) -> None:
        runs.append((note.stream, note.retry_count))
        if note.stream == "x" and note.retry_count == 0:
            raise RuntimeError("fails once")

    (entry_id,) = await produce(redis_server.url, service, "x")
    c = client(redis_server.url, service, recovery=False, retry_delay=0.0)
    requeue = probe(c).requeue
    sent, go_on = asyncio.Event(), asyncio.Event()
    run_batch = requeue.send

    async def slow_run(*args: Any, **kwargs: Any) -> Any:
        sent.set()
        await go_on.wait()  # the hand-back's reply is slow to come
        return await run_batch(*args, **kwargs)

    requeue.send = slow_run  # type: ignore[method-assign]
    runner = asyncio.create_task(c.run(handler))
    try:
        await asyncio.wait_for(sent.wait(), 10)
        assert requeue.handing_back == {entry_id}
        probe(c).lose_read_reply()  # the next read re-reads the pending list ("0") first
        await produce(redis_server.url, service, "y")  # wakes the reader
        await eventually(lambda: is_true(not probe(c).reader.reply_lost and ("y", 0) in runs))
        assert runs.count(("x", 0)) == 1  # not taken again while it is being handed back
        go_on.set()
        # Back with one retry counted: the re-read counted no delivery (a death) of its own.
        await eventually(lambda: is_true(c.stats.done == 2))
        assert sorted(runs) == [("x", 0), ("x", 1), ("y", 0)] and c.stats.handed_back == 1
    finally:
        go_on.set()
        await c.close()
        await runner


async def test_a_group_destroyed_under_a_waiting_reader_is_made_again(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # The reader waits in a blocking XREADGROUP. The group destroyed (by hand, or gone with a server
    # restarted empty), the wait fails; the group is made again, and later registrations are read.
    runs: list[str] = []

    async def handler(note: lbs.Notification) -> None:
        runs.append(note.stream)

    c = client(redis_server.url, service, read_block=15.0)
    runner = asyncio.create_task(c.run(handler))
    try:
        await eventually(lambda: is_true(probe(c).reader.blocked))
        await r.xgroup_destroy(_keys.input_stream(service), _keys.group_name(service))

        async def group_back() -> bool:
            groups = await r.xinfo_groups(_keys.input_stream(service))
            return any(g["name"] == _keys.group_name(service).encode() for g in groups)

        await eventually(group_back)
        await produce(redis_server.url, service, "a")
        await eventually(lambda: is_true("a" in runs), timeout=10.0)
        assert runs == ["a"]
    finally:
        await c.close()
        await runner


async def test_a_notification_is_an_async_with_block(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # An application task that dies without done_stream/hand_back must not
    # leak the stream: the block finishes it, or hands it back with a retry.
    await produce(redis_server.url, service, "ok", "fails")
    c = client(redis_server.url, service, recovery=False)
    await c.start()
    try:
        notes = {n.stream: n for n in await take(c, 2)}
        async with notes["ok"] as note:
            assert note.stream == "ok"
        with pytest.raises(RuntimeError):
            async with notes["fails"]:
                raise RuntimeError("boom")
        assert c.stats.done == 1
        (again,) = await take(c, 1)  # handed back (the reader may already hold it again)
        assert again.stream == "fails" and again.retry_count == 1
        async with again:
            pass
        with pytest.raises(lbs.InterfaceError):
            async with lbs.Notification(lbs.NotificationType.STREAM_EXPIRED, "x"):
                pass
    finally:
        await c.close()
    assert await r.xlen(lbs.input_stream(service)) == 0


async def test_a_stream_held_too_long_is_reported(
    redis_server: Any, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    await produce(redis_server.url, service, "forgotten")
    c = client(redis_server.url, service, recovery=False, lock_ttl=0.6, hold_warning=0.3)
    caplog.set_level(logging.WARNING, logger="lbs.client")
    await c.start()
    try:
        (note,) = await take(c, 1)
        await eventually(lambda: is_true(c.metrics.get("held_overdue") == 1), timeout=10)
        assert (
            sum(
                "forgotten" in r.getMessage() and "held for over" in r.getMessage()
                for r in caplog.records
            )
            == 1
        )
        await c.done_stream(note.stream)
        await eventually(lambda: is_true(c.metrics.get("held_overdue") == 0), timeout=10)
    finally:
        await c.close()


async def test_a_cancelled_run_handler_hands_its_stream_back(
    redis_server: Any, service: str
) -> None:
    # A handler cancelled by someone else (not a disown, not close()) would
    # otherwise leave its stream held forever under a healthy heartbeat.
    await produce(redis_server.url, service, "victim")
    c = client(redis_server.url, service, recovery=False)
    started: asyncio.Queue[lbs.Notification] = asyncio.Queue()

    async def handler(note: lbs.Notification) -> None:
        started.put_nowait(note)
        await asyncio.sleep(3600)

    runner = asyncio.create_task(c.run(handler, handle_signals=False))
    try:
        first = await asyncio.wait_for(started.get(), 10)
        (h,) = c.held_streams()
        assert h.task is not None
        h.task.cancel()
        again = await asyncio.wait_for(started.get(), 10)  # handed back, taken again
        assert (
            again.stream == "victim" and again.entry_id != first.entry_id and again.retry_count == 1
        )
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)


async def test_hand_back_under_run_stops_the_handler_first(redis_server: Any, service: str) -> None:
    # Finding 6: hand_back() inside run() left the handler running while the
    # same process took the stream again: two handlers for one stream.
    await produce(redis_server.url, service, "s")
    c = client(redis_server.url, service, recovery=False)
    running: dict[str, int] = {}
    ended: set[str] = set()
    most = 0
    started: asyncio.Queue[lbs.Notification] = asyncio.Queue()

    async def handler(note: lbs.Notification) -> None:
        nonlocal most
        running[note.stream] = running.get(note.stream, 0) + 1
        most = max(most, running[note.stream])
        try:
            started.put_nowait(note)
            await asyncio.sleep(3600)
        finally:
            running[note.stream] -= 1
            ended.add(note.entry_id)

    runner = asyncio.create_task(c.run(handler, handle_signals=False))
    try:
        first = await asyncio.wait_for(started.get(), 10)
        await c.hand_back(first.stream)
        # Ended before the stream went back. (The stream's next handler may
        # already have started by the time this task resumes: the entry that
        # hand_back wrote can be read and dispatched in the same loop turn.)
        assert first.entry_id in ended
        again = await asyncio.wait_for(started.get(), 10)
        assert again.entry_id != first.entry_id and again.retry_count == 0
        assert most == 1
    finally:
        await c.close()
        await asyncio.wait_for(runner, 10)


async def test_close_from_elsewhere_then_close_again_waits_for_the_shutdown(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # Finding 6: the README's pattern (close() from elsewhere, then close()
    # in finally) returned before the first close had handed anything back.
    await produce(redis_server.url, service, *[f"s{i}" for i in range(5)])
    c = client(redis_server.url, service, recovery=False)
    started = 0

    async def handler(note: lbs.Notification) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(3600)

    runner = asyncio.create_task(c.run(handler, handle_signals=False))
    await eventually(lambda: is_true(started == 5))
    elsewhere = asyncio.create_task(c.close())
    await asyncio.sleep(0)
    await c.close()  # the second call: returns only once the shutdown is over
    assert await r.xpending(lbs.input_stream(service), lbs.group_name(service)) == {
        "pending": 0,
        "min": None,
        "max": None,
        "consumers": [],
    }
    assert await r.exists(c.lease_key) == 0  # nothing pending: the lease went with the close
    await asyncio.wait_for(elsewhere, 1)
    await asyncio.wait_for(runner, 1)  # run() returned too


async def test_sigterm_stops_every_run_in_the_process_and_hands_back_without_a_retry(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # Two clients in one loop (as a sharded client or the demo has): one
    # SIGTERM reaches both; each run() returns once its streams are back,
    # with no retry counted; the process's own SIGTERM handler is put back.
    await produce(redis_server.url, service, *[f"s{i}" for i in range(6)])
    before = signal.getsignal(signal.SIGTERM)
    clients = [client(redis_server.url, service, consumer=f"w{i}", max_streams=3) for i in range(2)]
    started = 0

    async def handler(note: lbs.Notification) -> None:
        nonlocal started
        started += 1
        await asyncio.sleep(3600)

    runs = [asyncio.create_task(c.run(handler)) for c in clients]
    try:
        await eventually(lambda: is_true(started == 6))
        assert signal.getsignal(signal.SIGTERM) is not before  # lbs's handler is in place
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(*runs), 10)
    finally:
        for c in clients:
            await c.close()
    assert signal.getsignal(signal.SIGTERM) is before
    entries = await r.xrange(lbs.input_stream(service))
    assert len(entries) == 6 and all(f[b"_retry_count"] == b"0" for _, f in entries)
    assert (await r.xpending(lbs.input_stream(service), lbs.group_name(service)))["pending"] == 0
