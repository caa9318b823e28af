"""KeyedRunner against a fake wire: fetch-1 + XRANGE for a taken key, the handler's batches in
order, commit-1 with the position and effects (released, yielded, failed and parked), a key
lost or held elsewhere, an effect refused, the scripts lost or the connection dropped, close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from lbs._consumer.finisher import Finisher
from lbs._consumer.keyed import KeyedRunner
from lbs._consumer.topology import Topology
from lbs._waits import within
from lbs.config import Config
from lbs.keyed import KeyedBatch
from lbs.notifications import Notification, NotificationType

from _fakewire import FakeRedis, Harness, eventually


class Env:
    """A KeyedRunner wired as ``Client.run_keyed`` wires it, and the keys it is handed."""

    def __init__(
        self,
        fake: FakeRedis,
        handler: Callable[[KeyedBatch], Awaitable[Any]],
        *,
        batch: int = 10,
        max_hold_messages: int = 1000,
        **config: Any,
    ) -> None:
        cfg = Config(read_retry_initial=0.001, read_retry_max=0.002, **config)
        self.fake = fake
        self.h = Harness(fake, cfg)
        self.state = self.h.state
        self.finisher = Finisher(self.state, Topology(self.state, None))
        #: The seconds each failed key was parked for, as the delays task is told.
        self.parked: list[float] = []
        self.runner = KeyedRunner(
            self.state,
            self.finisher,
            handler,
            self.parked.append,
            batch=batch,
            max_hold_messages=max_hold_messages,
            max_hold_seconds=60.0,
        )
        self.prefix = self.h.names.key_prefix

    def publish(self, key: str, *values: str) -> list[str]:
        """Messages on ``key``'s data stream (as publish-1.lua appends them); their ids."""
        return [self.fake.add(self.prefix + "k:" + key, {"v": v}) for v in values]

    def take(self, key: str) -> Any:
        """``key``'s registration taken by the reader and dispatched."""
        x = self.h.take(key, {"lbs-keyed": "1"})
        note = Notification(NotificationType.STREAM_ADDED, key, x.entry_id, {}, 0, x.token)
        self.runner.dispatch(x, note)
        return x

    def state_of(self, key: str) -> dict[str, str]:
        return self.fake.hashes.get(self.prefix + "m:" + key, {})


@pytest.fixture
async def envs() -> AsyncIterator[list[Env]]:
    made: list[Env] = []
    yield made
    for env in made:
        await env.runner.close()
        await env.finisher.stop()


def _seen(batches: list[KeyedBatch]) -> list[list[str]]:
    return [[m.fields["v"] for m in b.messages] for b in batches]


async def test_a_key_is_fetched_handled_in_order_and_released_when_drained(
    fake: FakeRedis, envs: list[Env]
) -> None:
    batches: list[KeyedBatch] = []

    async def handler(batch: KeyedBatch) -> None:
        batches.append(batch)
        batch.emit(env.prefix + "out", {"sum": len(batch.messages)})

    env = Env(fake, handler, batch=2)
    envs.append(env)
    ids = env.publish("k", "a", "b", "c")
    x = env.take("k")
    await within(env.state.wait_finished(1), 5)
    assert _seen(batches) == [["a", "b"], ["c"]]
    assert batches[0].token == x.token and batches[0].entry_id == x.entry_id
    (fetch,) = fake.calls("fetch-1")
    n = env.h.names
    assert fetch.args == [env.prefix, n.lease_prefix, "2", n.group, "k", x.entry_id, x.value]
    assert x.value == f"{x.token}:{n.id}:{env.state.lease.value}"  # ours while the lease holds it
    xrange = fake.calls("XRANGE")[0]
    assert xrange.args == [env.prefix + "k:k", "-", "+", "COUNT", "2"]
    first, second = fake.calls("commit-1")
    assert first.args[8:14] == ["k", x.entry_id, x.value, ids[1], "go", ""]  # a full batch: go on
    assert second.args[11:13] == [ids[2], "last:2"]  # looked drained: let go if nothing came
    assert [f for _, f in fake.streams[env.prefix + "out"]] == [["sum", "2"], ["sum", "1"]]
    assert (env.state.stats.done, env.state.stats.keyed_messages) == (1, 3)
    assert len(env.state.holdings) == 0 and x.entry_id not in fake.pending
    assert env.prefix + "k:k" not in fake.streams and env.prefix + "m:k" not in fake.hashes
    assert fake.zsets[env.prefix + "idfloor"] == {"ms": int(ids[2].split("-")[0])}


async def test_a_handler_that_raises_hands_the_key_back_parked_with_its_position(
    fake: FakeRedis, envs: list[Env]
) -> None:
    async def handler(batch: KeyedBatch) -> None:
        batch.emit(env.prefix + "out", {"x": 1})
        raise ValueError("boom")

    env = Env(fake, handler, retry_delay=1.0, retry_delay_max=4.0)
    envs.append(env)
    ids = env.publish("k", "a", "b")
    x = env.take("k")
    await eventually(lambda: env.state.stats.handed_back == 1, "the key handed back")
    (commit,) = fake.calls("commit-1")
    mode = commit.args[12]
    _, ms, blame, last, n = mode.split(":")
    assert mode.startswith("fail:") and 500 <= int(ms) <= 1000 and blame == "0"
    assert (last, n) == (ids[1], "10")  # the failed batch ends at b: taken apart next
    assert commit.args[11] == "" and commit.args[14] == "ValueError: boom"  # position unmoved
    assert "Traceback" in commit.args[15] and commit.args[16] == "0"  # its effects dropped
    assert env.state.stats.handler_failures == 1 and len(env.state.holdings) == 0
    assert env.state_of("k")["until"] == ids[1] and env.state_of("k")["unblamed"] == "1"
    (parked,) = fake.streams[env.prefix + "delayed"]
    assert parked[1][:2] == ["lbs-input", commit.args[13]] and x.entry_id not in fake.pending
    assert env.prefix + "out" not in fake.streams
    assert env.parked == [int(ms) / 1000]  # the delays task polls by then, not at its idle pace


async def test_a_key_held_elsewhere_is_finished_unprocessed_and_a_lost_one_dropped(
    fake: FakeRedis, envs: list[Env]
) -> None:
    calls: list[KeyedBatch] = []

    async def handler(batch: KeyedBatch) -> None:
        calls.append(batch)

    env = Env(fake, handler)
    envs.append(env)
    env.publish("busy", "a")
    env.publish("lost", "a")
    other = env.h.deliver("busy", consumer="redis-consumer-other")
    fake.strings[env.h.lease_of("redis-consumer-other")] = "nonce"
    fake.hashes[env.prefix + "m:busy"] = {"holder": other}  # another live holder has the key
    # Read under the lease's first take; the lease lapsed and this process took it again since.
    lost = env.h.take("lost", {"lbs-keyed": "1"})
    fake.strings[env.h.names.lease_key] = env.state.lease.next()
    busy = env.take("busy")
    note = Notification(NotificationType.STREAM_ADDED, "lost", lost.entry_id, {}, 0, lost.token)
    env.runner.dispatch(lost, note)
    await within(env.state.wait_finished(1), 5)
    assert calls == []
    (done,) = fake.calls("XACKDEL")
    assert done.args[4:] == [busy.entry_id]
    name_holder = f"{env.h.names.key_prefix}name:busy"  # the name goes as its holder key
    assert [c.args[0] for c in fake.calls("DELEX")] == [name_holder]
    assert busy.entry_id not in fake.pending  # finished, not run
    assert env.state.stats.lock_lost == 1 and len(env.state.holdings) == 0
    assert fake.calls("commit-1") == []
    assert env.prefix + "m:lost" not in fake.hashes and lost.entry_id in fake.pending  # untouched


async def test_an_effect_that_cannot_be_written_fails_the_batch(
    fake: FakeRedis, envs: list[Env]
) -> None:
    async def handler(batch: KeyedBatch) -> None:
        batch.emit(env.prefix + "out", {"x": 1})

    env = Env(fake, handler, retry_delay=0.0, retry_delay_max=0.0)
    envs.append(env)
    fake.hashes[env.prefix + "out"] = {"not": "a stream"}
    env.publish("k", "a")
    env.take("k")
    await eventually(lambda: env.state.stats.handed_back == 1, "the key handed back")
    refused, failed = fake.calls("commit-1")
    assert refused.args[12] == "last:10" and failed.args[12].startswith("fail:0:1:")
    assert "holds a hash, not a stream" in failed.args[14]
    assert env.state.stats.handler_failures == 1 and env.state.stats.done == 0
    assert env.state_of("k")["fails"] == "1"  # one message, blamed on it
    assert len(fake.streams[env.h.names.stream_key]) == 1  # registered again at once (no delay)


async def test_a_hold_at_its_message_limit_yields_the_key(fake: FakeRedis, envs: list[Env]) -> None:
    async def handler(batch: KeyedBatch) -> None:
        pass

    env = Env(fake, handler, batch=2, max_hold_messages=2)
    envs.append(env)
    ids = env.publish("k", "a", "b", "c")
    x = env.take("k")
    await eventually(lambda: env.state.stats.handed_back == 1, "the key yielded")
    (commit,) = fake.calls("commit-1")
    assert commit.args[11:14] == [ids[1], "yield", commit.args[13]] and commit.args[13]
    assert env.state_of("k")["pos"] == ids[1]
    (again,) = [e for e in fake.streams[env.h.names.stream_key] if e[0] != x.entry_id]
    assert again[1][:2] == ["lbs-input", commit.args[13]]  # at the back of the LBS
    assert env.state.stats.done == 0 and len(env.state.holdings) == 0


@pytest.mark.parametrize("fault", ["noscript", "drop", "lose"])
async def test_a_round_trip_that_failed_is_sent_again(
    fake: FakeRedis, envs: list[Env], fault: str
) -> None:
    batches: list[KeyedBatch] = []

    async def handler(batch: KeyedBatch) -> None:
        batches.append(batch)

    env = Env(fake, handler)
    envs.append(env)
    env.publish("k", "a")
    x = env.take("k")
    fake.fail("fetch-1", fault)
    await within(env.state.wait_finished(1), 5)
    assert _seen(batches) == [["a"]]  # handled once
    assert len(fake.calls("fetch-1")) == 2
    if fault == "noscript":  # the XRANGE behind it was answered: loaded by the runner, not the wire
        assert "fetch-1" in fake.script_loads
    assert env.state.stats.done == 1 and x.entry_id not in fake.pending


async def test_close_stops_the_sender_with_a_round_trip_in_flight(
    fake: FakeRedis, envs: list[Env]
) -> None:
    async def handler(batch: KeyedBatch) -> None:
        pass

    env = Env(fake, handler)
    envs.append(env)
    env.publish("k", "a")
    gate = fake.hold("fetch-1")
    x = env.take("k")
    await within(gate.arrived.wait(), 5)
    await within(env.runner.close(), 5)
    gate.release()
    await asyncio.sleep(0)
    assert fake.calls("commit-1") == [] and len(fake.calls("fetch-1")) == 1
    assert env.state.holdings.table.get(x.entry_id) is x  # left to the lease's expiry
