"""Runner against a fake wire: a returning handler's stream finished (eagerly, batched), a failed
or timed-out one handed back with a retry counted, a disowned or cancelled one, and the
hand-back's retries when Redis is not reachable."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from lbs._consumer.finisher import Finisher
from lbs._consumer.requeue import Requeue
from lbs._consumer.runner import Handler, Runner
from lbs._consumer.topology import Topology
from lbs._waits import within
from lbs.config import Config
from lbs.notifications import Notification, NotificationType

from _fakewire import FakeRedis, Harness, eventually


class Env:
    """A Runner wired as ``Client.run`` wires it, with the finisher and requeue it is handed."""

    def __init__(self, fake: FakeRedis, handler: Handler, timeout: float | None = None) -> None:
        config = Config(read_retry_initial=0.001, read_retry_max=0.002, retry_delay=0.5)
        self.h = Harness(fake, config)
        self.state = self.h.state
        self.finisher = Finisher(self.state, Topology(self.state, None))
        self.requeue = Requeue(self.state)
        self.runner = Runner(self.state, self.finisher, self.requeue, handler, timeout)

    def dispatch(self, stream: str) -> Any:
        x = self.h.take(stream)
        note = Notification(NotificationType.STREAM_ADDED, x.stream, x.entry_id, {}, 0, x.token)
        self.runner.dispatch(x, note)
        return x


@pytest.fixture
async def stopper() -> AsyncIterator[list[Env]]:
    envs: list[Env] = []
    yield envs
    for env in envs:
        for task in list(env.state.handlers):
            task.cancel()
        await env.finisher.stop()


async def test_a_handler_that_returns_at_once_is_finished_without_a_loop_turn(
    fake: FakeRedis, stopper: list[Env]
) -> None:
    seen: list[str] = []

    async def handler(note: Notification) -> None:
        seen.append(note.stream)

    env = Env(fake, handler)
    stopper.append(env)
    x = env.dispatch("a")
    y = env.dispatch("b")
    assert seen == ["a", "b"]  # started eagerly, in dispatch
    assert env.finisher.finishing() == [x, y] and len(env.state.holdings) == 0
    assert env.state.handlers == set()
    await within(env.state.wait_finished(2), 5)
    (call,) = fake.calls("XACKDEL")  # both in one batch (the Lua-free done of Redis 8.6)
    assert call.args[4:] == [x.entry_id, y.entry_id]
    prefix = env.state.names.key_prefix
    names = [c.args[0] for c in fake.calls("DELEX")]
    assert names == [f"{prefix}name:a", f"{prefix}name:b"]  # their name holder keys
    assert env.state.stats.done == 2 and env.state.stats.handler_seconds.count == 2


async def test_a_handler_that_raises_is_handed_back_with_a_retry_and_its_traceback(
    fake: FakeRedis, stopper: list[Env]
) -> None:
    async def handler(note: Notification) -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    env = Env(fake, handler)
    stopper.append(env)
    x = env.dispatch("a")
    assert env.state.handlers  # it suspended: a task runs it
    (event,) = await env.h.recorder.wait("lbs_stream_handed_back")
    assert event["entry_id"] == x.entry_id and event["retry_counted"] is True
    (call,) = fake.requeued()
    assert [call.mode, call.value, call.increment] == ["owned", env.state.lease.value, "1"]
    assert call.reason == "handler raised ValueError: boom"
    assert call.first_ms == "500"  # parked for Config.retry_delay
    assert "ValueError: boom" in call.traceback and "Traceback" in call.traceback
    stats = env.state.stats
    assert (stats.handler_failures, stats.handler_timeouts, stats.retries_delayed) == (1, 0, 1)
    assert fake.calls("done-n") == [] and len(env.state.holdings) == 0


async def test_a_handler_past_its_timeout_is_cancelled_and_handed_back(
    fake: FakeRedis, stopper: list[Env]
) -> None:
    cancelled = asyncio.Event()

    async def handler(note: Notification) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    env = Env(fake, handler, timeout=0.01)
    stopper.append(env)
    env.dispatch("a")
    await within(cancelled.wait(), 5)
    await env.h.recorder.wait("lbs_stream_handed_back")
    (call,) = fake.requeued()
    assert call.reason == "handler timed out after 0.01s" and call.traceback == ""
    assert (env.state.stats.handler_timeouts, env.state.stats.handler_failures) == (1, 0)


async def test_a_stream_disowned_while_its_handler_ran_is_not_finished(
    fake: FakeRedis, stopper: list[Env]
) -> None:
    go = asyncio.Event()

    async def handler(note: Notification) -> None:
        await go.wait()

    env = Env(fake, handler)
    stopper.append(env)
    x = env.dispatch("a")
    (task,) = env.state.handlers
    env.state.holdings.drop(x)  # the heartbeat found the lease lost meanwhile: disowned
    go.set()
    await within(asyncio.wait([task]), 5)
    assert env.finisher.finishing() == [] and env.state.handlers == set()
    assert fake.calls("done-n") == [] and fake.calls("requeue-6") == []


@pytest.mark.parametrize("stopping", [False, True])
async def test_a_handler_cancelled_from_outside(
    fake: FakeRedis, stopper: list[Env], stopping: bool
) -> None:
    async def handler(note: Notification) -> None:
        await asyncio.Event().wait()

    env = Env(fake, handler)
    stopper.append(env)
    x = env.dispatch("a")
    if stopping:
        env.state.stopping.set()  # close() ran out of drain time: it hands the stream back itself
    (task,) = env.state.handlers
    task.cancel()
    await within(asyncio.wait([task]), 5)
    if stopping:
        assert env.state.holdings.table.get(x.entry_id) is x  # left for close()
        assert fake.calls("requeue-6") == []
    else:
        await env.h.recorder.wait("lbs_stream_handed_back")
        (call,) = fake.requeued()
        assert call.reason == "handler raised CancelledError: the handler was cancelled"


async def test_a_hand_back_redis_did_not_answer_is_tried_again(
    fake: FakeRedis, stopper: list[Env]
) -> None:
    async def handler(note: Notification) -> None:
        raise RuntimeError("x")

    env = Env(fake, handler)
    stopper.append(env)
    fake.fail("requeue-6", "lose")  # it ran; its reply was lost
    x = env.dispatch("a")
    await eventually(lambda: len(fake.calls("requeue-6")) == 2, "the hand-back sent again")
    await eventually(lambda: not env.state.handlers, "the hand-back over")
    # The first call handed it back; the second found it no longer pending and changed nothing.
    parked = fake.streams[env.requeue.delays.parked_key]
    assert len(parked) == 1 and x.entry_id not in fake.pending
    assert env.h.recorder.of("lbs_stream_handed_back") == []  # its reply never came


async def test_a_hand_back_refused_for_good_is_not_tried_again(
    fake: FakeRedis, stopper: list[Env]
) -> None:
    async def handler(note: Notification) -> None:
        raise RuntimeError("x")

    env = Env(fake, handler)
    stopper.append(env)
    fake.fail("requeue-6", "NOPERM this user has no permissions to run the 'evalsha' command")
    x = env.dispatch("a")
    await eventually(lambda: not env.state.handlers, "the hand-back over")
    assert len(fake.calls("requeue-6")) == 1
    # Left pending to us under our lease: handed back at close, or recovered once the lease is gone.
    assert fake.pending[x.entry_id] == env.state.names.id and env.h.lease == env.state.lease.value
