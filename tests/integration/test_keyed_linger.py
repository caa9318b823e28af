"""Lingering keys (``run_keyed(linger=...)``): a drained key stays with its holder, woken by publish."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys
from lbs.testing import abandon, freeze

import _helpers
from _helpers import eventually

pytestmark = pytest.mark.timeout(120)

CFG = dict(read_block=0.05, configure_keyspace_events=False, lock_ttl=2.0)
#: Longer than any wait below: a message handled in time was woken, not found at the linger's end.
LONG = 120.0


@pytest.fixture
def url(any_server: Any) -> str:
    return str(any_server.url)


def client(url: str, service: str, consumer: str = "c1", **kw: Any) -> lbs.Client:
    return _helpers.client(url, service, consumer, **{**CFG, **kw})


class Seen:
    """What a keyed handler was given: (key, message n, entry id, token, retry count) per message."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, str, int, int]] = []

    async def handle(self, batch: lbs.KeyedBatch) -> None:
        for m in batch.messages:
            n = int(m.fields["n"])
            self.rows.append((batch.key, n, batch.entry_id, batch.token, batch.retry_count))

    def of(self, key: str) -> list[int]:
        return [n for k, n, *_ in self.rows if k == key]

    async def count(self, n: int) -> bool:
        return len(self.rows) >= n


async def registrations(r: aioredis.Redis, service: str) -> int:
    """Entries ever added to the LBS (XINFO STREAM entries-added)."""
    return int((await r.xinfo_stream(_keys.input_stream(service)))["entries-added"])


async def lingering(r: aioredis.Redis, service: str, key: str) -> bool:
    """Whether ``key``'s state says its holder keeps it drained (commit-1.lua ``stay``)."""
    fields = await r.hkeys(_keys.key_prefix(service) + "m:" + key)
    return any(f.startswith(b"idle:") for f in fields)


async def handled_then_lingering(
    pub: lbs.Publisher, rr: aioredis.Redis, service: str, seen: Seen, key: str, n: int, total: int
) -> None:
    """Publish message ``n`` of ``key``; wait until ``total`` messages were handled and ``key``
    lingers again."""
    await pub.publish(key, {"n": n})
    await eventually(lambda: seen.count(total))
    await eventually(lambda: lingering(rr, service, key))


async def test_a_quiet_key_stays_with_its_holder_and_each_message_wakes_it(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    seen, c = Seen(), client(url, service)
    runner = asyncio.create_task(c.run_keyed(seen.handle, linger=LONG))
    try:
        async with lbs.Publisher(url, service) as pub:
            await handled_then_lingering(pub, rr, service, seen, "k", 0, 1)
            added = await registrations(rr, service)
            for i in range(1, 6):
                # Woken: handled long before the linger ends.
                await handled_then_lingering(pub, rr, service, seen, "k", i, i + 1)
            assert await registrations(rr, service) == added  # never registered again
    finally:
        await c.close()
        await runner
    assert seen.of("k") == list(range(6))
    assert len({(e, t) for _, _, e, t, _ in seen.rows}) == 1  # one hold throughout
    # close() let the drained key go: nothing of it is left.
    assert await rr.exists(_keys.keyed_stream(service, "k"), _keys.key_prefix(service) + "m:k") == 0
    assert await rr.xlen(_keys.input_stream(service)) == 0


async def test_a_key_with_no_message_for_linger_seconds_is_let_go(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    seen, c = Seen(), client(url, service)
    runner = asyncio.create_task(c.run_keyed(seen.handle, linger=0.3))
    try:
        async with lbs.Publisher(url, service) as pub:
            await pub.publish("k", {"n": 0})
        await c.wait_finished(1, timeout=30)  # let go: a finished stream
        assert await rr.xlen(_keys.input_stream(service)) == 0
        assert await rr.exists(_keys.key_prefix(service) + "m:k") == 0
        async with lbs.Publisher(url, service) as pub:  # registered again, taken again
            await pub.publish("k", {"n": 1})
        await c.wait_finished(2, timeout=30)
    finally:
        await c.close()
        await runner
    assert seen.of("k") == [0, 1]


async def test_lingering_keys_take_no_slot(url: str, service: str, rr: aioredis.Redis) -> None:
    """With concurrency 1, a key lingering does not keep the consumer from taking the next."""
    seen, c = Seen(), client(url, service)
    runner = asyncio.create_task(c.run_keyed(seen.handle, 1, linger=LONG))
    try:
        async with lbs.Publisher(url, service) as pub:
            for i, key in enumerate(("a", "b", "c")):
                await handled_then_lingering(pub, rr, service, seen, key, 0, i + 1)
            await pub.publish("a", {"n": 1})
            await eventually(lambda: seen.count(4))
    finally:
        await c.close()
        await runner
    assert (seen.of("a"), seen.of("b"), seen.of("c")) == ([0, 1], [0], [0])


async def test_a_key_that_starts_lingering_frees_its_slot_for_the_reader_at_once(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """A full reader waits for a slot to free (up to ``read_block``, long here): a key that lingers
    frees one, so the next key is read at once, not after ``read_block`` or the linger."""
    seen, c = Seen(), client(url, service, read_block=30.0)
    runner = asyncio.create_task(c.run_keyed(seen.handle, 1, linger=LONG))
    try:
        async with lbs.Publisher(url, service) as pub:
            await pub.publish_many([("a", {"n": 0}), ("b", {"n": 0})])
            await eventually(lambda: seen.count(2), timeout=10)
    finally:
        await c.close()
        await runner
    assert (seen.of("a"), seen.of("b")) == ([0], [0])


async def test_a_wake_lost_with_its_connection_is_made_up_when_the_listener_is_back(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    seen, c = Seen(), client(url, service)
    runner = asyncio.create_task(c.run_keyed(seen.handle, linger=LONG))
    try:
        async with lbs.Publisher(url, service) as pub:
            await handled_then_lingering(pub, rr, service, seen, "k", 0, 1)
            await rr.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            await pub.publish("k", {"n": 1})  # its wake may find nobody subscribed
            await eventually(lambda: seen.count(2), timeout=30)
    finally:
        await c.close()
        await runner
    assert seen.of("k") == [0, 1]


async def test_a_holder_that_dies_while_its_key_lingers_costs_the_next_message_no_try(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """The dead holder ran nothing (its ``idle:<token>`` says so): the message published after its
    death runs at retry count 0, with no failure counted against it."""
    first, c1 = Seen(), client(url, service, "c1")
    runner = asyncio.create_task(c1.run_keyed(first.handle, linger=LONG))
    async with lbs.Publisher(url, service) as pub:
        await handled_then_lingering(pub, rr, service, first, "k", 0, 1)
        await abandon(c1)  # killed: its lease expires, recovery re-queues the key's entry
        await runner
        await pub.publish("k", {"n": 1})
    second, c2 = Seen(), client(url, service, "c2")
    runner = asyncio.create_task(c2.run_keyed(second.handle, linger=LONG))
    try:
        await eventually(lambda: second.count(1), timeout=60)
        state = await rr.hgetall(_keys.key_prefix(service) + "m:k")
    finally:
        await c2.close()
        await runner
    assert [(k, n, r) for k, n, _, _, r in second.rows] == [("k", 1, 0)]
    assert b"fails" not in state and b"until" not in state


async def test_a_holder_that_dies_running_a_message_it_was_woken_for_is_counted(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """Woken, the holder says it runs again (``HDEL idle:<token>``) before its handler starts: its death
    in the handler is a failed hold of that message, as for any holder."""
    first, c1 = Seen(), client(url, service, "c1")
    running = asyncio.Event()

    async def stuck(batch: lbs.KeyedBatch) -> None:
        await first.handle(batch)
        if any(m.fields["n"] == "1" for m in batch.messages):
            running.set()
            await asyncio.Event().wait()  # never returns: the process dies in it

    runner = asyncio.create_task(c1.run_keyed(stuck, linger=LONG))
    async with lbs.Publisher(url, service) as pub:
        await handled_then_lingering(pub, rr, service, first, "k", 0, 1)
        await pub.publish("k", {"n": 1})
        await asyncio.wait_for(running.wait(), 30)
        await freeze(c1)  # stalled in the handler: its lease lapses, as a dead process's would
    second, c2 = Seen(), client(url, service, "c2")
    other = asyncio.create_task(c2.run_keyed(second.handle, linger=LONG))
    try:
        await eventually(lambda: second.count(1), timeout=60)
    finally:
        await c2.close()
        await other
        await abandon(c1)
        await runner
    assert [(k, n, r) for k, n, _, _, r in second.rows] == [("k", 1, 1)]


async def test_keys_woken_beyond_the_consumers_slots_are_yielded_and_still_run_in_order(
    url: str, service: str, rr: aioredis.Redis
) -> None:
    """Lingering keys take no slot, so more may wake than ``concurrency`` allows: those beyond it go
    to the back of the LBS (a consumer with a free slot takes them), none is lost or reordered."""
    seen, c = Seen(), client(url, service)
    runner = asyncio.create_task(c.run_keyed(seen.handle, 1, linger=LONG))
    keys = [f"k{i}" for i in range(5)]
    try:
        async with lbs.Publisher(url, service) as pub:
            for i, key in enumerate(keys):
                await handled_then_lingering(pub, rr, service, seen, key, 0, i + 1)
            for n in (1, 2):
                await pub.publish_many([(key, {"n": n}) for key in keys])  # all wake at once
            await eventually(lambda: seen.count(3 * len(keys)), timeout=60)
    finally:
        await c.close()
        await runner
    assert all(seen.of(key) == [0, 1, 2] for key in keys)


async def test_one_publish_call_wakes_each_holder_once_for_all_its_lingering_keys(
    url: str, service: str, rr: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """publish-1.lua sends one wake per consumer per call, a JSON array of its keys; a message on the
    channel that is not one is logged and wakes nothing."""
    seen, c = Seen(), client(url, service)
    runner = asyncio.create_task(c.run_keyed(seen.handle, linger=LONG))
    keys = ["a", "b", "c"]
    try:
        async with lbs.Publisher(url, service) as pub:
            for i, key in enumerate(keys):
                await handled_then_lingering(pub, rr, service, seen, key, 0, i + 1)
            who = (await rr.hget(_keys.key_prefix(service) + "m:a", "who")).decode()
            channel = f"{_keys.key_prefix(service)}wake:{who}"
            listener = aioredis.Redis.from_url(url)
            sub = listener.pubsub()
            await sub.ssubscribe(channel)
            try:
                await rr.execute_command("SPUBLISH", channel, "not a wake")
                await rr.execute_command("SPUBLISH", channel, '["a", 1]')
                await pub.publish_many([(key, {"n": 1}) for key in keys])
                heard: list[bytes] = []

                async def three() -> bool:
                    msg = await sub.get_message(ignore_subscribe_messages=True, timeout=0.1)
                    if msg is not None:
                        heard.append(msg["data"])
                    return len(heard) >= 3

                await eventually(three)
                await eventually(lambda: seen.count(6))
            finally:
                await sub.aclose()
                await listener.aclose()
    finally:
        await c.close()
        await runner
    assert heard == [b"not a wake", b'["a", 1]', b'["a","b","c"]']
    assert [seen.of(key) for key in keys] == [[0, 1]] * 3
    warned = [r.getMessage() for r in caplog.records if "that is not a wake" in r.getMessage()]
    assert len(warned) == 2, warned
