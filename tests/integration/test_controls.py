"""An operator's hands on live work (lbs.ServiceControls): pause and resume a service, release, cancel
and force-claim a held stream, on running consumers (run()), with the default Config but short blocks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs.events import read_events

from _helpers import Hold, eventually, is_true, running

pytestmark = pytest.mark.timeout(120)


async def test_a_paused_service_starts_nothing_new_while_held_work_finishes(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    h = Hold("hold")
    producer = lbs.Producer(r, service)
    async with (
        running(redis_server.url, service, h, "c1"),
        running(redis_server.url, service, h, "c2"),
    ):
        await producer.add_stream("hold-1")
        await asyncio.wait_for(h.started.wait(), 10)
        async with lbs.ServiceControls(r, service) as controls:
            state = await controls.pause(by="ana", reason="db migration")
            assert (state.by, state.reason) == ("ana", "db migration")
            assert (await controls.paused()) == state
            ids = await producer.add_streams([f"new-{i}" for i in range(5)])
            # Every consumer's look comes within a second; each take checks the pause in its MULTI.
            await asyncio.sleep(2.5)
            assert [n.stream for n in h.calls] == ["hold-1"]
            h.go.set()  # held work finishes while paused: acked, nothing new taken
            await eventually(lambda: _pending_is(r, service, 0), timeout=10)
            # What waits is what was registered, no retry counted (a batch put back has none).
            entries = await r.xrange(lbs.input_stream(service))
            assert len(entries) == 5
            assert all(int(f.get(b"_retry_count", b"0")) == 0 for _, f in entries)
            assert await controls.resume(by="ana") == state
            assert await controls.paused() is None
        await eventually(lambda: is_true(len(h.calls) == 6), timeout=15)
        assert sorted(n.stream for n in h.calls[1:]) == [f"new-{i}" for i in range(5)]
        assert len(ids) == 5
    kinds = [e.kind for e in await read_events(r, service)]
    assert "paused" in kinds and "resumed" in kinds


async def _pending_is(r: aioredis.Redis, service: str, n: int) -> bool:
    info = await r.xpending(lbs.input_stream(service), lbs.group_name(service))
    return int(info["pending"]) == n


async def test_a_consumer_started_while_paused_takes_nothing(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await lbs.Producer(r, service).add_streams(["a", "b"])
    async with lbs.ServiceControls(r, service) as controls:
        await controls.pause(by="ana")
        h = Hold("hold")
        async with running(redis_server.url, service, h, "c1"):
            await asyncio.sleep(1.5)
            assert h.calls == []
            await controls.resume(by="ana")
            await eventually(lambda: is_true(len(h.calls) == 2), timeout=15)


@contextlib.asynccontextmanager
async def held_by_c1(
    url: str, r: aioredis.Redis, service: str, stream: str
) -> AsyncIterator[tuple[Hold, str, lbs.ServiceControls]]:
    """``stream`` registered and held, for the block, by consumer c1 running a ``Hold("hold")``:
    that handler, the stream's entry id and the service's controls (on ``r``)."""
    h = Hold("hold")
    (entry_id,) = await lbs.Producer(r, service).add_streams([stream])
    async with running(url, service, h, "c1"):
        await asyncio.wait_for(h.started.wait(), 10)
        async with lbs.ServiceControls(r, service) as controls:
            yield h, entry_id, controls


async def test_release_hands_a_held_stream_back_with_no_retry_and_it_runs_again(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    async with held_by_c1(redis_server.url, r, service, "hold-r") as (h, entry_id, controls):
        (o,) = await controls.release([entry_id], by="ana", reason="rebalance")
        assert o.outcome == "released" and o.holder.endswith("c1"), o
        assert h.cancelled == [entry_id]
        # Back in the LBS under a new id, no retry counted; taken again.
        await eventually(lambda: is_true(len(h.calls) == 2), timeout=15)
        again = h.calls[1]
        assert (again.stream, again.entry_id, again.retry_count) == ("hold-r", o.detail, 0)
        h.go.set()
    events = await read_events(r, service, kinds=["released"])
    assert events and events[-1].fields["by"] == "ana"
    assert events[-1].fields["new_entry_id"] == o.detail
    assert not await r.keys(lbs._keys.hash_tag(service) + ":orders:*")  # the order is gone


async def test_cancel_dead_letters_a_held_stream_with_the_operators_reason(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    async with held_by_c1(redis_server.url, r, service, "hold-c") as (h, entry_id, controls):
        (o,) = await controls.cancel(entry_id, by="ana", reason="poison")
        (again,) = await controls.cancel(entry_id, by="ana")
        assert o.outcome == "cancelled", o
        assert again.outcome == "not held"
        assert h.cancelled == [entry_id]
        async with lbs.DeadLetters(r, service) as dlq:
            (letter,) = await dlq.list(5)
        assert letter.id == o.detail
        assert letter.reason == "cancelled by ana: poison"
        await asyncio.sleep(0.5)
        assert len(h.calls) == 1  # not run again


async def test_force_claim_requeues_a_stuck_holders_stream_and_the_holder_drops_it(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    h2 = Hold("hold")
    async with held_by_c1(redis_server.url, r, service, "hold-f") as (h1, entry_id, controls):
        (o,) = await controls.force_claim([entry_id], by="ana", reason="stuck")
        (gone,) = await controls.force_claim(["1-1"], by="ana")
        assert o.outcome == "force-claimed" and o.holder.endswith("c1"), o
        assert gone.outcome == "not held"
        await eventually(lambda: is_true(h1.cancelled == [entry_id]), timeout=10)
        async with running(redis_server.url, service, h2, "c2"):
            h1.go.set()
            h2.go.set()
            await eventually(lambda: is_true(len(h1.calls) + len(h2.calls) == 2), timeout=15)
    (retry,) = [n.retry_count for n in (h1.calls + h2.calls)[1:]]
    assert retry == 1
    kinds = [e.kind for e in await read_events(r, service)]
    assert "force_claimed" in kinds and "dropped" in kinds


async def test_bad_arguments_are_errors(redis_server: Any, service: str, r: aioredis.Redis) -> None:
    async with lbs.ServiceControls(r, service) as controls:
        with pytest.raises(lbs.ConfigurationError):
            await controls.release(["nope"], by="ana")
        with pytest.raises(lbs.ConfigurationError):
            await controls.pause(by=" ")
