"""Finishing without Lua (Redis >= 8.4): XACKDEL and DELEX IFEQ in one pipeline, release-1.lua only
for a name that registrations wait for; on 7.0 and Valkey the same outcomes from done-n.lua.

An entry id is only ever pending to the consumer it was first delivered to (recovery re-queues a copy
under a new id), so a done needs no lease check: a holder whose entry was put back while its lease
lapsed acks nothing and leaves the copy's name alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

import lbs
from _lbscore import CommandBatch
from lbs._keys import group_name, input_stream, key_prefix, name_holder, waiting_list
from lbs._redis import scripts
from lbs._redis.scripts import DoneCode

from _helpers import client, command_calls, eventually, produce, take

pytestmark = pytest.mark.timeout(120)


async def test_a_batch_finishes_with_xackdel_and_delex_and_no_name_script(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await produce(redis_server.url, service, "a", "b", "c")
    c = client(redis_server.url, service, max_streams=3, lock_ttl=30)
    await c.start()
    try:
        notes = await take(c, 3)
        before = await command_calls(r)
        statuses = await c.done_streams([n.stream for n in notes])
        after = await command_calls(r)
        assert statuses == [lbs.DoneStatus.DONE] * 3
        # One XACKDEL for the batch and a compare-and-delete per name; done-n.lua (which releases
        # names with MGET + DEL) did not run.
        assert after.get("xackdel", 0) - before.get("xackdel", 0) == 1
        assert after.get("delex", 0) - before.get("delex", 0) == 3
        assert after.get("mget", 0) == before.get("mget", 0)
        assert await r.xlen(input_stream(service)) == 0
        assert not await r.exists(*(name_holder(service, s) for s in "abc"))
    finally:
        await c.close()


async def test_a_name_registrations_wait_for_is_handed_on_when_its_holder_is_done(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "x")
    c = client(any_server.url, service, max_streams=4, lock_ttl=30)
    await c.start()
    try:
        (first,) = await take(c, 1)
        await produce(any_server.url, service, "x")  # waits: x is held
        await eventually(lambda: _has(rr, waiting_list(service, "x")))
        assert await c.done_stream("x") is lbs.DoneStatus.DONE
        (second,) = await take(c, 1)  # the waiter, back in the LBS and read
        assert second.stream == "x" and second.entry_id != first.entry_id
        assert second.token is not None and first.token is not None
        assert second.token > first.token
        assert await rr.get(name_holder(service, "x")) == second.entry_id.encode()
        assert await c.done_stream("x") is lbs.DoneStatus.DONE
        assert not await rr.exists(name_holder(service, "x"), waiting_list(service, "x"))
    finally:
        await c.close()


async def _has(rr: aioredis.Redis, key: str) -> bool:
    return bool(await rr.exists(key))


async def test_a_name_key_of_another_type_fails_only_its_own_release(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    await produce(any_server.url, service, "a", "b")
    c = client(any_server.url, service, max_streams=2, lock_ttl=30)
    await c.start()
    try:
        await take(c, 2)
        await rr.delete(name_holder(service, "a"))
        await rr.rpush(name_holder(service, "a"), "garbage")
        statuses = await c.done_streams(["a", "b"])
        assert statuses == [lbs.DoneStatus.DONE, lbs.DoneStatus.DONE]
        assert await rr.lrange(name_holder(service, "a"), 0, -1) == [b"garbage"]
        assert not await rr.exists(name_holder(service, "b"))
        pending = await rr.xpending(input_stream(service), group_name(service))
        assert pending["pending"] == 0
    finally:
        await c.close()


async def test_a_done_of_an_entry_put_back_since_acks_nothing_and_leaves_the_copys_name(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """What a holder whose lease lapsed sends once it wakes: the entry was put back under a new id, and
    the copy is held by a consumer; the old id's XACKDEL and DELEX change nothing of it."""
    await produce(redis_server.url, service, "x")
    c = client(redis_server.url, service, lock_ttl=60, heartbeat_interval=50)
    await c.start()
    try:
        (old,) = await take(c, 1)
        await r.delete(lbs.lease_key(service, c.id))  # lapsed
        assert await c.heartbeat() == 1  # put back as a fresh entry
        (copy,) = await take(c, 1)  # and read again, under the new lease
        assert copy.entry_id != old.entry_id

        keys = [name_holder(service, "x")]
        b = CommandBatch()
        scripts.plain_done(b, input_stream(service), group_name(service), [old.entry_id], keys)
        replies = await r.execute_command("XACKDEL", *_args(b, 0))
        delex = await r.execute_command("DELEX", *_args(b, 1))
        codes, waited, _ = scripts.plain_codes([replies, delex], keys, retrying=False)
        assert codes == [DoneCode.LOCK_LOST] and waited == []
        rows = await r.xpending_range(input_stream(service), group_name(service), "-", "+", 10)
        assert [r["message_id"].decode() for r in rows] == [copy.entry_id]
        assert await r.get(name_holder(service, "x")) == copy.entry_id.encode()
        assert await c.done_stream("x") is lbs.DoneStatus.DONE
    finally:
        await c.close()


def _args(b: CommandBatch, index: int) -> list[bytes]:
    """The arguments (after the command name) of command ``index`` of a batch, from its RESP."""
    raw = bytes(b.getvalue())
    commands: list[list[bytes]] = []
    pos = 0
    while pos < len(raw):
        assert raw[pos : pos + 1] == b"*"
        end = raw.index(b"\r\n", pos)
        n = int(raw[pos + 1 : end])
        pos = end + 2
        parts = []
        for _ in range(n):
            end = raw.index(b"\r\n", pos)
            size = int(raw[pos + 1 : end])
            parts.append(raw[end + 2 : end + 2 + size])
            pos = end + 2 + size + 2
        commands.append(parts)
    return commands[index][1:]


def test_plain_codes_reads_a_retry_and_the_names_left_to_release() -> None:
    keys = ["{s-input}:name:a", "", "{s-input}:name:c"]
    replies: list[Any] = [[1, -1, 1], 0, 1]
    assert scripts.plain_codes(replies, keys, retrying=False) == ([1, 3, 1], [0], {})
    assert scripts.plain_codes([[-1, -1, 1], 0, 0], keys, retrying=True) == ([4, 4, 1], [2], {})
    with pytest.raises(TypeError):
        scripts.plain_codes([[1], 1], keys, retrying=False)
    refused = ResponseError("NOGROUP")
    with pytest.raises(ResponseError):
        scripts.plain_codes([refused, 1, 1], keys, retrying=False)
    # A DELEX refused (a name key of another type) leaves that name alone, nothing else.
    wrong = ResponseError("WRONGTYPE")
    assert scripts.plain_codes([[1, 1, 1], wrong, 0], keys, retrying=False) == (
        [1, 1, 1],
        [2],
        {0: wrong},
    )
    assert key_prefix("s") == "{s-input}:"
