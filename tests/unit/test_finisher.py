"""Finisher against a fake wire: batching into one done-n.lua call, each reply code's status,
the retry flag after a lost reply, retries until Redis answers, failures reaching the waiters,
drain and stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from lbs._consumer.finisher import Finisher
from lbs._consumer.topology import Topology
from lbs._waits import within
from lbs.exceptions import RedisOperationError
from lbs.notifications import DoneStatus

from _fakewire import FakeRedis, Harness, eventually


@pytest.fixture
async def env(fake: FakeRedis) -> AsyncIterator[tuple[Harness, Finisher]]:
    h = Harness(fake)
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
    assert call.keys == [n.stream_key, *(x.lock_key for x in held)]
    assert call.args[:5] == [n.group, "1", "0", n.key_prefix, ""]  # XACKDEL on 8.6, no retry
    names = [f"{n.key_prefix}name:{x.stream}" for x in held]  # their name holder keys
    assert call.args[5:] == [x.value for x in held] + [x.entry_id for x in held] + names
    assert not fake.pending and not fake.strings  # acked and released
    assert finisher.finishing() == []


async def test_each_reply_code_is_a_status_counted_and_reported(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    ours, expired, lost = h.take("ours"), h.take("expired"), h.take("lost")
    del fake.strings[expired.lock_key]  # gone, still pending: 2
    fake.strings[lost.lock_key] = "999:someone-else"  # another holder's: 3
    statuses = await within(finisher.finish([ours, expired, lost]), 5)
    assert statuses == [DoneStatus.DONE, DoneStatus.LOCK_EXPIRED, DoneStatus.LOCK_LOST]
    stats = h.state.stats
    assert (stats.finished, stats.done, stats.lock_expired, stats.lock_lost) == (3, 1, 1, 1)
    assert [e["status"] for e in h.recorder.of("lbs_lock_released")] == statuses
    (batch,) = h.recorder.of("lbs_locks_released")
    assert [(x.entry_id, s) for x, s in batch["released"]] == [
        (x.entry_id, s) for x, s in zip((ours, expired, lost), statuses)
    ]
    assert fake.strings == {lost.lock_key: "999:someone-else"}  # another's lock is untouched


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


async def test_redis_unreachable_is_retried_with_the_locks_kept_alive(
    env: tuple[Harness, Finisher], fake: FakeRedis
) -> None:
    h, finisher = env
    x = h.take("s")
    fake.fail("done-n", "drop", times=2)  # the first try and its resend on a fresh connection
    gate = fake.hold("done-n")  # the retry after the back-off: held in flight
    waiter = asyncio.ensure_future(finisher.finish([x]))
    await within(gate.arrived.wait(), 5)
    assert finisher.finishing() == [x]  # the heartbeat keeps extending it meanwhile
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
    fake.strings[b.lock_key] = "1:another"
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
