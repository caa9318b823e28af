"""The consumer lease against real Redis 8.x and 7.0: one key holds everything pending to a consumer.

Its heartbeat extends that key and nothing per stream; a lease that lapses while its holder lives
disowns what it held and puts it back with no retry counted; a consumer whose lease is gone loses its
streams to recovery; a read or a done under a lease that is not the reader's own does nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
import lbs._keys
from lbs._keys import consumers_key, fence_key, group_name, input_stream, name_holder
from lbs._redis.scripts import source
from lbs.testing import abandon, freeze

from _helpers import client, command_calls, eventually, produce, take

pytestmark = pytest.mark.timeout(120)


async def test_a_tick_extends_one_key_however_many_streams_are_held(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, *(f"s{i}" for i in range(200)))
    # A tick every 50 s: none of the background's falls between the two commandstats reads.
    c = client(any_server.url, service, max_streams=200, lock_ttl=60, heartbeat_interval=50)
    await c.start()
    try:
        await take(c, 200)
        key = lbs.lease_key(service, c.id)
        assert await rr.get(key) == c.instance.encode()
        assert await c.heartbeat() == 0  # the first tick also reads the server's clock
        await rr.pexpire(key, 5_000)  # shortened by hand: the tick sets it back to the TTL
        before = await command_calls(rr)
        assert await c.heartbeat() == 0
        after = await command_calls(rr)
        sent = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        sent.pop("info", None)
        if any_server.set_ifeq:
            # No Lua: SET lease IFEQ + ZADD deadline + TIME in one MULTI.
            assert sent == {"multi": 1, "set": 1, "zadd": 1, "time": 1, "exec": 1}, sent
        else:
            # One script call, whatever is held: the lease's PEXPIRE and the deadline, no XCLAIM.
            assert sent.get("evalsha") == 1 and sent.get("pexpire") == 1, sent
            assert "set" not in sent and "xclaim" not in sent, sent
        assert sum(sent.values()) < 12, sent  # and no command per stream (200 held)
        assert await rr.pttl(key) > 55_000
        pending = await rr.xpending(input_stream(service), group_name(service))
        assert pending["pending"] == 200
    finally:
        await c.close()


async def test_a_close_puts_back_what_is_pending_to_it_and_no_longer_held(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """An entry pending to the consumer that it does not track (a read the stop cut between its
    XREADGROUP and its take, a disowned stream whose put-back the heartbeat had not sent) goes back
    at close, no retry counted: nothing stays pending to a consumer that closed cleanly."""
    await produce(any_server.url, service, "held", "stray")
    c = client(any_server.url, service, max_streams=1, lock_ttl=30)
    await c.start()
    try:
        (note,) = await take(c, 1)
        # The stray: delivered to this consumer by a read whose take never happened.
        reply = await rr.xreadgroup(
            group_name(service), c.id, {input_stream(service): ">"}, count=1
        )
        ((_, ((stray_id, _),)),) = reply
    finally:
        await c.close()
    assert (await rr.xpending(input_stream(service), group_name(service)))["pending"] == 0
    left = {f[b"_original_id"]: f for _, f in await rr.xrange(input_stream(service))}
    assert set(left) == {stray_id, note.entry_id.encode()}  # both back, under new ids
    assert all(f[b"_retry_count"] == b"0" for f in left.values())


@pytest.mark.parametrize("warm", [False, True], ids=["first-tick", "later-tick"])
async def test_a_lease_lost_while_its_holder_lives_puts_its_streams_back_without_a_retry(
    any_server: Any, service: str, rr: aioredis.Redis, warm: bool
) -> None:
    """The first tick is extend-n.lua; a later one, which knows the server's clock, is the Lua-free
    MULTI where the server has SET ... IFEQ: each finds the lapse."""
    await produce(any_server.url, service, "a", "b")
    c = client(any_server.url, service, "c1", lock_ttl=30, max_streams=2)
    await c.start()
    try:
        notes = await take(c, 2)
        key = lbs.lease_key(service, c.id)
        if warm:
            assert await c.heartbeat() == 0
        await rr.delete(key)  # a lapse (an eviction, a stall past the TTL)
        assert await c.heartbeat() == 2
        disowned = await take(c, 2, kind=lbs.NotificationType.STREAM_DISOWNED)
        assert {n.stream for n in disowned} == {"a", "b"}
        # Taken again under a new value: a write built under the lapsed one is refused.
        assert await rr.get(key) == f"{c.instance}.2".encode()
        # Put back as fresh entries with no retry counted; this consumer takes them again.
        again = await take(c, 2)
        assert {n.stream for n in again} == {"a", "b"}
        assert all(n.retry_count == 0 for n in again)
        assert {n.entry_id for n in again}.isdisjoint(n.entry_id for n in notes)
        assert all(n.token > max(m.token for m in notes) for n in again)
    finally:
        await c.close()


@pytest.mark.parametrize("warm", [False, True], ids=["first-tick", "later-tick"])
@pytest.mark.parametrize("holds", ["another-instance", "a-hash"])
async def test_a_lease_key_holding_something_else_is_never_overwritten_by_a_tick(
    any_server: Any,
    service: str,
    rr: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    warm: bool,
    holds: str,
) -> None:
    await produce(any_server.url, service, "a")
    c = client(any_server.url, service, "c1", lock_ttl=30)
    await c.start()
    key = lbs.lease_key(service, c.id)
    try:
        await take(c, 1)
        if warm:
            assert await c.heartbeat() == 0
        if holds == "a-hash":
            await rr.delete(key)
            await rr.hset(key, "x", "1")
        else:
            await rr.set(key, "other-process")
        with caplog.at_level(logging.ERROR, logger="lbs"):
            assert await c.heartbeat() == 1  # what it held was read under a lease not its own
        if holds == "a-hash":
            assert await rr.hgetall(key) == {b"x": b"1"}
            assert "holds a value of the wrong type, not a lease" in caplog.text
        else:
            assert await rr.get(key) == b"other-process"
            assert (
                f"another live process runs with consumer id {c.id} (instance other-process"
                in caplog.text
            )
        # The deadline index still times this consumer (a lease it cannot see is no reason to hide).
        assert await rr.zscore(consumers_key(service), c.id) is not None
    finally:
        await rr.delete(key)
        await c.close()


async def test_a_later_tick_dates_the_deadline_by_the_servers_clock(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """The Lua-free tick writes the deadline from the client's estimate of the server's clock (the
    previous tick's TIME): it lands within a loaded machine's round trip of TIME + TTL."""
    c = client(any_server.url, service, "c1", lock_ttl=30)
    await c.start()
    try:
        assert await c.heartbeat() == 0
        await asyncio.sleep(0.2)  # the estimate must carry over time, not just repeat the last TIME
        seconds, micros = await rr.time()
        assert await c.heartbeat() == 0
        after_s, after_us = await rr.time()
        deadline = await rr.zscore(consumers_key(service), c.id)
        low = seconds * 1000 + micros // 1000 + 30_000
        high = after_s * 1000 + after_us // 1000 + 30_000
        assert low - 50 <= deadline <= high + 50, (low, deadline, high)
    finally:
        await c.close()


async def test_a_dead_consumers_streams_go_to_a_live_one_once_its_lease_is_gone(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, *(f"s{i}" for i in range(5)))
    dead = client(any_server.url, service, "dead", lock_ttl=1.0)
    await dead.start()
    first = await take(dead, 5)
    await abandon(dead)  # no heartbeat, no close: a kill -9
    live = client(any_server.url, service, "live", lock_ttl=1.0, deadline_poll_interval=0.05)
    await live.start()
    try:
        got = await take(live, 5, timeout=10)
        assert {n.stream for n in got} == {n.stream for n in first}
        assert all(n.token > max(m.token for m in first) for n in got)
        assert await rr.exists(lbs.lease_key(service, dead.id)) == 0
    finally:
        await live.close()


async def test_a_re_read_under_a_lease_not_its_own_lists_nothing(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """read-3.lua (the re-read after a lost reply) checks the lease first: what it would list under a
    lease not this process's is held by nobody."""
    await produce(any_server.url, service, "x")
    r = aioredis.from_url(any_server.url)
    try:
        await r.xgroup_create(input_stream(service), group_name(service), "0", mkstream=True)
        await r.xreadgroup(group_name(service), "c1", {input_stream(service): ">"})
        key = lbs.lease_key(service, "c1")
        args = [group_name(service), "c1", 10, "nonce", ""]
        keys = [input_stream(service), fence_key(service), key]
        for held in (None, "other"):
            if held is not None:
                await r.set(key, held)
            with pytest.raises(aioredis.ResponseError, match=f"^LEASE {held or ''}$"):
                await r.eval(source("read-3"), 3, *keys, *args)
        assert not await r.exists(fence_key(service))  # nothing written
        await r.set(key, "nonce")
        entries, tokens = await r.eval(source("read-3"), 3, *keys, *args)
        assert len(entries) == 1 and isinstance(tokens[0], int)
    finally:
        await r.aclose()


async def test_done_under_a_lease_overwritten_acks_only_what_nobody_else_can_have(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """done-n.lua (7.x, Valkey) refuses a done whose lease holds another value; the Lua-free done (Redis
    >= 8.4) acks the entry, still pending to this consumer alone (recovery would re-queue a copy under
    a new id, whose own done the old id cannot touch: test_done_plain.py)."""
    await produce(any_server.url, service, "x")
    c = client(any_server.url, service, lock_ttl=30)
    await c.start()
    plain = any_server.version >= (8, 4)  # Valkey answers as Redis 7.2.4
    try:
        (note,) = await take(c, 1)
        await rr.set(lbs.lease_key(service, c.id), "someone-else")
        status = await c.done_stream("x")
        pending = await rr.xpending(input_stream(service), group_name(service))
        if plain:
            assert status is lbs.DoneStatus.DONE and pending["pending"] == 0
        else:
            assert status is lbs.DoneStatus.LOCK_LOST and pending["pending"] == 1
        assert note.entry_id
    finally:
        await rr.set(lbs.lease_key(service, c.id), c.instance)
        await c.close()


async def test_a_clean_close_deletes_the_lease(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    c = client(any_server.url, service, lock_ttl=30)
    await c.start()
    key = lbs.lease_key(service, c.id)
    assert await rr.get(key) == c.instance.encode()
    await c.close()
    assert await rr.exists(key) == 0


async def test_a_zombies_ack_of_its_old_id_leaves_the_copy_a_live_peer_recovered(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """c1 stalls (nothing of it reaches Redis) and its lease lapses; c2's recovery puts its entry back
    under a NEW id and c2 takes the copy. What c1's Lua-free done sends once it wakes, XACKDEL of its
    old id and DELEX of the name IFEQ that id, neither acks nor deletes c2's entry, which stays pending
    to c2, nor frees the name c2 holds."""
    url = redis_server.url
    await produce(url, service, "x")
    # Its own recovery off: the peer's alone finds the entry.
    zombie = client(url, service, "c1", lock_ttl=60, heartbeat_interval=50, recovery=False)
    peer = client(url, service, "c2", lock_ttl=60, heartbeat_interval=50)
    await zombie.start()
    try:
        (old,) = await take(zombie, 1)
        await freeze(zombie)  # SIGSTOP-like: no heartbeat, no reads
        await r.delete(lbs.lease_key(service, zombie.id))  # its lease lapsed
        await r.zadd(consumers_key(service), {zombie.id: 1})  # and its deadline passed
        await peer.start()  # room for many: it would take the entry over under its id if it adopted
        (copy,) = await take(peer, 1, timeout=20)
        assert copy.stream == "x" and copy.entry_id != old.entry_id  # a new id
        assert (
            copy.retry_count == 1
        )  # taken by the application (running): a death counted, as before
        stream, group, name = input_stream(service), group_name(service), name_holder(service, "x")
        assert await r.execute_command("XACKDEL", stream, group, "IDS", 1, old.entry_id) == [-1]
        assert await r.execute_command("DELEX", name, "IFEQ", old.entry_id) == 0
        pending = await r.xpending_range(stream, group, "-", "+", 10)
        assert [(p["message_id"].decode(), p["consumer"].decode()) for p in pending] == [
            (copy.entry_id, peer.id)
        ]
        assert len(await r.xrange(stream, copy.entry_id, copy.entry_id)) == 1
        assert await r.get(name) == copy.entry_id.encode()
        assert await peer.done_stream("x") is lbs.DoneStatus.DONE
    finally:
        await peer.close()
        await zombie.close()


async def test_an_entry_whose_name_key_is_garbage_goes_back_and_runs_once_the_key_is_removed(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """Held by nobody otherwise (its consumer's lease lives, so no recovery takes it): it is parked for
    a retry delay, no retry counted, and read again until the key is gone."""
    garbage = lbs._keys.name_holder(service, "g")
    await rr.hset(garbage, "x", "1")
    await produce(any_server.url, service, "g")
    c = client(any_server.url, service, retry_delay=0.2, lock_ttl=30)
    await c.start()
    try:
        await eventually(lambda: _parked(rr, service))
        await rr.delete(garbage)
        (note,) = await take(c, 1, timeout=20)
        assert note.stream == "g" and note.retry_count == 0
        assert await c.done_stream("g") is lbs.DoneStatus.DONE
    finally:
        await c.close()


async def _parked(rr: aioredis.Redis, service: str) -> bool:
    return bool(await rr.zcard(lbs._keys.due_key(service)))


async def test_an_entry_pending_to_a_live_consumer_that_no_longer_tracks_it_goes_back(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    """A stray (here: read by hand under the consumer's id; in life, a hand-back or a done Redis
    refused) is held by nobody while the lease lives, and no recovery takes it: the heartbeat puts it
    back once per reconciliation_interval, no retry counted, and it runs."""
    c = client(
        any_server.url,
        service,
        lock_ttl=0.5,
        reconciliation_interval=1.0,
        recovery=False,
        max_streams=1,
    )
    await c.start()
    try:
        await produce(any_server.url, service, "busy")
        await take(c, 1)  # full: it reads no more till this is done
        (stray,) = await produce(any_server.url, service, "stray")
        got = await rr.xreadgroup(group_name(service), c.id, {input_stream(service): ">"}, count=1)
        assert got and got[0][1][0][0].decode() == stray
        assert await c.done_stream("busy") is lbs.DoneStatus.DONE
        (note,) = await take(c, 1, timeout=20)
        assert (note.stream, note.retry_count) == ("stray", 0) and note.entry_id != stray
        assert await c.done_stream("stray") is lbs.DoneStatus.DONE
    finally:
        await c.close()
