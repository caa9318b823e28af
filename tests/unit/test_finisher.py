"""Finisher against a fake wire: batching into one done-n.lua call under the consumer's lease, each
reply code's status, the retry flag after a lost reply, retries until Redis answers, failures
reaching the waiters, drain and stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lbs._consumer.finisher import Finisher
from lbs._consumer.topology import Topology
from lbs._waits import within
from lbs.config import Config
from lbs.exceptions import RedisOperationError
from lbs.notifications import DoneStatus

from _fakewire import FAST, FakeRedis, Harness, eventually


@pytest.fixture
async def env(fake: FakeRedis) -> AsyncIterator[tuple[Harness, Finisher]]:
    """A finisher calling done-n.lua (Redis 8.2: XACKDEL, no DELEX), the contract these tests check;
    test_done_plain.py checks the Lua-free pipeline against Redis 8.6."""
    h = Harness(fake)
    h.state.server.version = (8, 2, 0)
    finisher = Finisher(h.state, Topology(h.state, None))
    yield h, finisher
    await finisher.stop()


async def test_concurrent_finishes_go_in_one_done_call(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    held = [h.take(f"s{i}") for i in range(3)]
    for x in held:
        h.state.holdings.drop(x)
    statuses = await within(asyncio.gather(*(finisher.finish([x]) for x in held)), 5)
    assert statuses == [[DoneStatus.DONE]] * 3
    (call,) = fake.calls("done-n")
    n = h.names
    assert call.keys == [n.stream_key, n.lease_key]
    lease = h.state.lease.value
    # XACKDEL on 8.6, no retry, names released, our name and lease, not beside a Go fleet.
    assert call.args[:7] == [n.group, "1", "0", n.key_prefix, n.id, lease, "0"]
    names = [f"{n.key_prefix}name:{x.stream}" for x in held]  # their name holder keys
    assert call.args[7:] == [x.entry_id for x in held] + names
    assert not fake.pending and fake.strings == {n.lease_key: lease}  # acked; the lease stays
    assert all(fake.entry(n.stream_key, x.entry_id) is None for x in held)  # and deleted
    assert finisher.finishing() == []


async def test_each_reply_code_is_a_status_counted_and_reported(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    ours, lost = h.take("ours"), h.take("lost")
    del fake.pending[lost.entry_id]  # handed on meanwhile (no longer pending): 3
    statuses = await within(finisher.finish([ours, lost]), 5)
    assert statuses == [DoneStatus.DONE, DoneStatus.LOCK_LOST]
    stats = h.state.stats
    assert (stats.finished, stats.done, stats.lock_expired, stats.lock_lost) == (2, 1, 0, 1)
    assert [e["status"] for e in h.recorder.of("lbs_lock_released")] == statuses
    (batch,) = h.recorder.of("lbs_locks_released")
    assert [(x.entry_id, s) for x, s in batch["released"]] == [
        (x.entry_id, s) for x, s in zip((ours, lost), statuses)
    ]
    # What was not pending is not ours to delete (requeue-6 may keep it as a dead letter's record).
    assert fake.entry(h.names.stream_key, lost.entry_id) is not None


@pytest.mark.parametrize("lease", [None, "0123456789ab.2"])
async def test_a_done_under_a_lapsed_lease_loses_every_stream_and_writes_nothing(
    env: tuple[Harness, Finisher], fake: FakeRedis, lease: str | None
) -> None:
    """The lease gone, or taken again by this process (a new value) after it lapsed: what was read
    under the old one may be another consumer's by now, so none of it is acked."""
    h, finisher = env
    a, b = h.take("a"), h.take("b")
    if lease is None:
        del fake.strings[h.names.lease_key]
    else:
        fake.strings[h.names.lease_key] = lease
    statuses = await within(finisher.finish([a, b]), 5)
    assert statuses == [DoneStatus.LOCK_LOST] * 2
    assert h.state.stats.lock_lost == 2 and h.state.stats.done == 0
    assert set(fake.pending) == {a.entry_id, b.entry_id}  # still pending: recovery's
    assert all(fake.entry(h.names.stream_key, x.entry_id) for x in (a, b))
    assert h.lease == lease


async def test_a_lapsed_lease_fails_what_waits_and_leaves_the_call_in_flight(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    """The heartbeat found the lease lapsed (``lease_lost``): what waits to be finished was read under
    it and is never sent (LOCK_LOST); the call already in flight gets Redis's own answer."""
    h, finisher = env
    a, b, c = h.take("a"), h.take("b"), h.take("c")
    gate = fake.hold("done-n")
    first = asyncio.ensure_future(finisher.finish([a]))
    await within(gate.arrived.wait(), 5)
    second = asyncio.ensure_future(finisher.finish([b]))  # queued behind the call in flight
    finisher.queue(c)  # queued, nobody waiting: logged
    await eventually(lambda: len(finisher.finishing()) == 3, "b and c queued")
    finisher.lease_lost()
    assert await within(second, 5) == [DoneStatus.LOCK_LOST]
    assert finisher.finishing() == [a]
    gate.release()
    assert await within(first, 5) == [DoneStatus.DONE]
    assert len(fake.calls("done-n")) == 1 and set(fake.pending) == {b.entry_id, c.entry_id}
    assert [(e["stream"], e["status"]) for e in h.recorder.of("lbs_lock_released")] == [
        ("c", DoneStatus.LOCK_LOST),
        ("b", DoneStatus.LOCK_LOST),
        ("a", DoneStatus.DONE),
    ]
    assert (h.state.stats.done, h.state.stats.lock_lost) == (1, 2)


@pytest.mark.parametrize("waiter", [True, False])
async def test_a_lapsed_lease_leaves_a_sent_call_whose_reply_was_lost_unknown(
    fake: FakeRedis, waiter: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A done sent whose reply was lost (twice: it waits to be sent again) may have run before the
    lease lapsed: it is not reported LOCK_LOST (the stream may be finished), nor DONE (a re-queue
    may have come first): its waiter gets an error saying so; a handler's stream is counted finished,
    logged, and reported to no hook."""
    slow = Config(**{**FAST, "read_retry_initial": 30.0, "read_retry_max": 30.0})  # type: ignore[arg-type]
    h = Harness(fake, slow)
    h.state.server.version = (8, 2, 0)
    finisher = Finisher(h.state, Topology(h.state, None))
    try:
        x = h.take("s")
        fake.fail("done-n", "lose", times=2)  # it runs, twice, and no reply comes back
        if waiter:
            done = asyncio.ensure_future(finisher.finish([x]))
        else:
            finisher.queue(x)
        await eventually(
            lambda: "trying again" in caplog.text, "the batch waits 30 s to be sent again"
        )
        finisher.lease_lost()
        if waiter:
            with pytest.raises(RedisOperationError, match="finished, or put back"):
                await within(done, 5)
        assert finisher.finishing() == []
        assert h.recorder.of("lbs_lock_released") == []
        assert (h.state.stats.finished, h.state.stats.lock_lost) == (0 if waiter else 1, 0)
        assert "no call can tell" in caplog.text
        assert len(fake.calls("done-n")) == 2
    finally:
        await finisher.stop()


async def test_a_lost_reply_is_sent_again_flagged_and_reads_already_done(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    x = h.take("s")
    fake.fail("done-n", "lose")  # it runs; the connection drops before its reply
    assert await within(finisher.finish([x]), 5) == [DoneStatus.DONE]
    first, again = fake.calls("done-n")
    assert (first.args[2], again.args[2]) == ("0", "1")
    assert h.state.stats.done == 1 and h.state.stats.lock_lost == 0  # ALREADY_DONE is DONE
    assert "done_failures_total" not in h.metrics


@pytest.mark.parametrize("fault", ["noscript", "loading"])
async def test_noscript_or_loading_on_the_first_try_is_answered_by_the_wire(
    env: tuple[Harness, Finisher], fake: FakeRedis, fault: str
) -> None:
    h, finisher = env
    x = h.take("s")
    fake.fail("done-n", fault)
    assert await within(finisher.finish([x]), 5) == [DoneStatus.DONE]
    first, again = fake.calls("done-n")
    assert first.args == again.args  # sent again as it was: it ran nowhere, no retry flag
    assert ("done-n" in fake.script_loads) == (fault == "noscript")
    assert "done_failures_total" not in h.metrics


async def test_redis_unreachable_is_retried_with_the_lease_kept_alive(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    x = h.take("s")
    fake.fail("done-n", "drop", times=2)  # the first try and its resend on a fresh connection
    gate = fake.hold("done-n")  # the retry after the back-off: held in flight
    waiter = asyncio.ensure_future(finisher.finish([x]))
    await within(gate.arrived.wait(), 5)
    assert finisher.finishing() == [x]  # the heartbeat keeps extending the lease meanwhile
    assert h.metrics["done_failures_total"] == 1
    gate.release()
    assert await within(waiter, 5) == [DoneStatus.DONE]
    assert [c.args[2] for c in fake.calls("done-n")] == ["0", "1", "1"]
    assert finisher.finishing() == []


async def test_an_error_reply_fails_the_waiters_with_a_redis_operation_error(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    a, b = h.take("a"), h.take("b")
    fake.fail("done-n", "ERR something the finisher cannot retry")
    results = await within(
        asyncio.gather(finisher.finish([a]), finisher.finish([b]), return_exceptions=True), 5
    )
    assert all(isinstance(r, RedisOperationError) for r in results), results
    assert "ERR something" in str(results[0])
    assert len(fake.calls("done-n")) == 1 and h.metrics["done_failures_total"] == 2
    assert h.state.stats.finished == 0
    # The finisher goes on: the next finish is a new batch.
    assert await within(finisher.finish([a]), 5) == [DoneStatus.DONE]


async def test_drain_fails_what_was_not_sent_and_stop_cancels_what_is_in_flight(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    a, b = h.take("a"), h.take("b")
    gate = fake.hold("done-n")
    first = asyncio.ensure_future(finisher.finish([a]))
    await within(gate.arrived.wait(), 5)
    second = asyncio.ensure_future(finisher.finish([b]))  # queued behind the batch in flight
    await eventually(lambda: b in finisher.finishing(), "b queued")
    await finisher.drain(0.05)
    with pytest.raises(RedisOperationError, match="closed before Redis answered"):
        await within(second, 5)
    assert not first.done()
    await finisher.stop()
    with pytest.raises(asyncio.CancelledError):
        await within(first, 5)
    assert len(fake.calls("done-n")) == 1


async def test_queue_without_a_waiter_logs_and_reports_the_batch(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    a, b = h.take("a"), h.take("b")
    del fake.pending[b.entry_id]  # handed on meanwhile
    finisher.queue(a)
    finisher.queue(b)
    (event,) = await h.recorder.wait("lbs_locks_released")
    assert [(x.stream, s) for x, s in event["released"]] == [
        ("a", DoneStatus.DONE),
        ("b", DoneStatus.LOCK_LOST),
    ]
    assert len(fake.calls("done-n")) == 1
    await finisher.drain(5)  # idle: returns at once
    assert h.state.stats.finished == 2
