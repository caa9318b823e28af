"""What a holder's death counts against: its queued set ({<service>-input}:queued:<consumer>) holds the
streams it merely held (read for the application, not taken yet), and requeue-6.lua counts a death
only against the others; a holder that lived pardons the deaths counted against what it lost.
Checked on Redis 8.6 and 7.0."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys
from lbs.testing import freeze, probe

from _helpers import client, eventually, is_true, take


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


async def test_queued_streams_are_merely_held_until_the_application_takes_them(
    any_server, service
) -> None:
    url = any_server.url
    r = aioredis.Redis.from_url(url)
    async with lbs.Producer(url, service) as p:
        await p.add_streams(["a", "b", "c"])
    c = client(url, service, max_streams=3)
    try:
        await c.start()
        await eventually(lambda: is_true(c.held == 3))
        me = c.id
        assert await _queued(r, service, me) == set(
            await _pending(r, service)
        )  # read, queued: merely held
        first = await c.next_notification(timeout=5)
        assert first is not None and first.stream == "a"
        queued = await _queued(r, service, me)
        assert (
            first.entry_id not in queued and len(queued) == 2
        )  # told before the application got it
        rest = c.drain_notifications()
        assert [n.stream for n in rest] == ["b", "c"]

        async def all_running() -> bool:
            return not await _queued(r, service, me)

        await eventually(all_running)  # drain_notifications tells Redis in the background
        assert all(h.running for h in c.held_streams())
    finally:
        await c.close()
        await r.aclose()


async def _two_held(url: str, service: str) -> tuple[lbs.Client, lbs.Client]:
    """ "running" and "queued" registered; a client "dead" holds both, "rescuer" is made (not started)."""
    async with lbs.Producer(url, service) as p:
        await p.add_streams(["running", "queued"])
    return (
        client(url, service, "dead", max_streams=2, recovery=False),
        client(url, service, "rescuer", recovery=False),
    )


async def _take_running(dead: lbs.Client) -> lbs.Notification:
    """Start ``dead``; its application takes "running" (the other stays queued)."""
    await dead.start()
    await eventually(lambda: is_true(dead.held == 2))
    note = await dead.next_notification(timeout=5)
    assert note is not None and note.stream == "running"
    return note


async def test_a_death_counts_only_against_running_streams_and_a_pardon_takes_it_back(
    any_server, service
) -> None:
    url = any_server.url
    r = aioredis.Redis.from_url(url)
    dead, rescuer = await _two_held(url, service)
    try:
        note = await _take_running(dead)
        # The process dies: nothing more of it reaches Redis; its locks go, and its instance marker
        # with them (alive, it would count as an idle peer to share the work with).
        await freeze(dead)
        for h in dead.held_streams():
            await r.delete(h.lock_key)
        await r.delete(_keys.lease_key(service, dead.id))
        assert await rescuer.recovery.poll_deadlines() == 0  # its deadline has not passed yet
        assert await rescuer.recovery.scan(min_idle=0) == {"requeued": 2, "alive": 0, "pending": 2}
        copies = await _copies(r, service)
        assert (
            copies["running"][b"_retry_count"] == b"1"
            and copies["running"][b"_deaths"] == note.entry_id.encode()
        )
        assert copies["queued"][b"_retry_count"] == b"0" and b"_deaths" not in copies["queued"]
        # Its holder was in fact alive (a partition): it pardons the entry; the copy's next trip takes it back.
        await probe(dead).requeue.pardon([note.entry_id])
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


async def _die(r: aioredis.Redis, service: str, c: lbs.Client) -> None:
    """``c``'s process dies: nothing more of it reaches Redis, its locks and its instance marker go
    and its deadline passes."""
    await freeze(c)
    for h in c.held_streams():
        await r.delete(h.lock_key)
    await r.delete(_keys.lease_key(service, c.id))
    await r.zadd(_keys.consumers_key(service), {c.id: 1})


@pytest.mark.parametrize("room", [True, False])
async def test_a_rescuer_re_queues_a_dead_holders_streams_with_room_or_without(
    any_server, service, room
) -> None:
    """The deadline poller re-queues a dead holder's streams as fresh entries (new ids), the death
    counted against the running one only, whether the rescuer has room or not: it never adopts (an
    entry id stays pending to the process that read it). A pardon takes the death back on the next
    trip."""
    url = any_server.url
    r = aioredis.Redis.from_url(url)
    dead, rescuer = await _two_held(url, service)
    try:
        await _take_running(dead)
        old = {h.stream: h for h in dead.held_streams()}
        await _die(r, service, dead)
        if room:
            await rescuer.start()
        assert await rescuer.recovery.poll_deadlines() == 2
        copies = await _copies(r, service)
        assert (
            copies["running"][b"_retry_count"] == b"1" and copies["queued"][b"_retry_count"] == b"0"
        )
        if room:
            back = await take(rescuer, 2)  # STREAM_ADDED (the recovery notices skipped)
            by_stream = {n.stream: n for n in back}
            assert all(by_stream[s].entry_id != old[s].entry_id for s in old)  # new ids
            assert all(by_stream[s].token > old[s].token for s in old)
        else:
            await rescuer.start()
        # The dead holder was in fact alive (a partition): it pardons the running stream.
        await probe(dead).requeue.pardon([old["running"].entry_id])
        await eventually(lambda: is_true(rescuer.held == 2))
        await rescuer.close()  # hands both back, no retry counted
        copies = await _copies(r, service)
        assert copies["running"][b"_retry_count"] == b"0" and b"_deaths" not in copies["running"]
        assert copies["queued"][b"_retry_count"] == b"0"
        assert (
            await r.zscore(_keys.pardons_key(service), old["running"].entry_id) is None
        )  # used up
    finally:
        await rescuer.close()
        await dead.close()
        await r.aclose()
