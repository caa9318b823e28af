"""What a holder's death counts against: its queued set ({<service>-input}:queued:<consumer>) holds the
streams it merely held (read for the application, not taken yet), and requeue-6.lua counts a death
only against the others; a holder that lived pardons the deaths counted against what it lost.
Checked on Redis 8.6 and 7.0."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys

from _helpers import client, eventually, is_true



async def _queued(r: aioredis.Redis, service: str, consumer: str) -> set[str]:
    """The entry ids in ``consumer``'s queued set."""
    return {m.decode() for m in await r.smembers(_keys.queued_prefix(service) + consumer)}


async def _pending(r: aioredis.Redis, service: str) -> list[str]:
    page = await r.xpending_range(lbs.input_stream(service), lbs.group_name(service), "-", "+", 100)
    return [p["message_id"].decode() for p in page]


async def _copies(r: aioredis.Redis, service: str) -> dict[str, dict[bytes, bytes]]:
    out = {}
    for _, fields in await r.xrange(lbs.input_stream(service)):
        out[lbs.decode_input(fields[b"lbs-input"])[0]] = fields
    return out


async def test_queued_streams_are_merely_held_until_the_application_takes_them(any_server, service) -> None:
    url = any_server.url
    r = aioredis.Redis.from_url(url)
    async with lbs.Producer(url, service) as p:
        await p.add_streams(["a", "b", "c"])
    c = client(url, service, max_streams=3)
    try:
        await c.start()
        await eventually(lambda: is_true(c.held == 3))
        me = c.id
        assert await _queued(r, service, me) == set(await _pending(r, service))  # read, queued: merely held
        first = await c.next_notification(timeout=5)
        assert first is not None and first.stream == "a"
        queued = await _queued(r, service, me)
        assert first.entry_id not in queued and len(queued) == 2  # told before the application got it
        rest = c.drain_notifications()
        assert [n.stream for n in rest] == ["b", "c"]

        async def all_running() -> bool:
            return not await _queued(r, service, me)

        await eventually(all_running)  # drain_notifications tells Redis in the background
        assert all(h.running for h in c.held_streams())
    finally:
        await c.close()
        await r.aclose()


async def test_a_death_counts_only_against_running_streams_and_a_pardon_takes_it_back(any_server, service) -> None:
    url = any_server.url
    r = aioredis.Redis.from_url(url)
    async with lbs.Producer(url, service) as p:
        await p.add_streams(["running", "queued"])
    dead = client(url, service, "dead", max_streams=2, recovery=False)
    rescuer = client(url, service, "rescuer", recovery=False)
    try:
        await dead.start()
        await eventually(lambda: is_true(dead.held == 2))
        note = await dead.next_notification(timeout=5)
        assert note is not None and note.stream == "running"
        # The process dies: nothing more of it reaches Redis; its locks go.
        await dead._heartbeat.stop()
        await dead._reader.stop()
        for h in dead.held_streams():
            await r.delete(h.lock_key)
        assert await rescuer.recovery.poll_deadlines() == 0  # its deadline has not passed yet
        assert await rescuer.recovery.scan(min_idle=0) == {"requeued": 2, "alive": 0, "pending": 2}
        copies = await _copies(r, service)
        assert copies["running"][b"_retry_count"] == b"1" and copies["running"][b"_deaths"] == note.entry_id.encode()
        assert copies["queued"][b"_retry_count"] == b"0" and b"_deaths" not in copies["queued"]
        # Its holder was in fact alive (a partition): it pardons the entry; the copy's next trip takes it back.
        await dead._requeue.pardon([note.entry_id])
        assert await r.zscore(_keys.pardons_key(service), note.entry_id) is not None
        await rescuer.start()
        await eventually(lambda: is_true(rescuer.held == 2))
        await rescuer.close()  # hands both back, no retry counted
        copies = await _copies(r, service)
        assert copies["running"][b"_retry_count"] == b"0" and b"_deaths" not in copies["running"]
    finally:
        await rescuer.close()
        await dead.close()
        await r.aclose()
