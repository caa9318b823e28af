"""The Lua scripts check every precondition before their first write.

Each script is called directly (EVAL of ``lbs._redis.scripts.source``) against a
real server with one key of the service set to something it must not hold:
the call is refused with an error (or an output) naming the key, and a DUMP
of every key of the service shows that nothing was written. Redis does not
roll back a script that fails part-way, so "refused" must mean "untouched".
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from lbs._keys import (
    consumers_key,
    dead_letter_stream,
    delayed_stream,
    due_key,
    fence_key,
    group_name,
    input_stream,
    lease_key,
    key_prefix,
    lock_key,
    name_holder,
    queued_prefix,
    waiting_key,
)
from lbs._redis.scripts import done_codes, source

from _helpers import reap

pytestmark = pytest.mark.timeout(60)

TTL = 60_000


@pytest.fixture(params=["0", "1"])
def xackdel(request: pytest.FixtureRequest, any_server: Any) -> str:
    """done-n.lua's XACKDEL flag: both on Redis 8.x, XACK + XDEL only on 7.0 and Valkey 9.1."""
    if request.param == "1" and not any_server.xackdel:
        pytest.skip(f"XACKDEL needs Redis >= 8.2, not {any_server.name}")
    return str(request.param)


@pytest.fixture(params=["0", "1"])
def msetex(request: pytest.FixtureRequest, any_server: Any) -> str:
    """read-3.lua's MSETEX flag: both on Redis >= 8.4 and Valkey 9.1, SET NX per entry only on 7.0."""
    if request.param == "1" and not any_server.msetex:
        pytest.skip(f"MSETEX needs Redis >= 8.4 or Valkey >= 9.1, not {any_server.name}")
    return str(request.param)


def us(t: tuple[int, int]) -> int:
    return t[0] * 1_000_000 + t[1]


# -- calling the scripts ------------------------------------------------------


async def read(
    r: aioredis.Redis,
    service: str,
    consumer: str = "c1",
    count: int = 10,
    start: str = ">",
    owner: str | None = None,
    msetex: str | None = None,
    fair_ms: int | None = None,
) -> Any:
    args: list[Any] = [group_name(service), consumer, count, TTL, lock_key(service, ""), start, ""]
    if owner is not None or msetex is not None or fair_ms is not None:
        args.append(owner or "")
    if msetex is not None or fair_ms is not None:
        args.append(msetex or "")
    if fair_ms is not None:  # ARGV[10..12] none, ARGV[13] the window
        args += ["", "", "", fair_ms]
    return await r.eval(
        source("read-3"),
        3,
        input_stream(service),
        fence_key(service),
        consumers_key(service),
        *args,
    )


async def done(
    r: aioredis.Redis,
    service: str,
    locks: list[tuple[str, str]],
    xackdel: str = "0",
    retry: str = "0",
    names: list[str] | None = None,
) -> list[int]:
    """One done-n.lua call; with ``names`` (each lock's DataStreamName) it releases them."""
    keys = [input_stream(service)] + [lock_key(service, i) for i, _ in locks]
    args = [group_name(service), xackdel, retry, key_prefix(service) if names else "", ""]
    holders = [name_holder(service, n) if n else "" for n in names or [""] * len(locks)]
    args += [v for _, v in locks] + [i for i, _ in locks] + holders
    return done_codes(await r.eval(source("done-n"), len(keys), *keys, *args))


async def extend(
    r: aioredis.Redis,
    service: str,
    locks: list[tuple[str, str]],
    last: str = "1",
    nonce: str = "n1",
    consumer: str = "c1",
    ttl: int = TTL,
    flags: str = "",
) -> list[Any]:
    """One extend-n.lua call; ``flags`` "" refreshes every entry, else one "1"/"0" per lock (only
    the flagged entries' ids are sent)."""
    keys = [input_stream(service), consumers_key(service), lease_key(service, consumer)]
    keys += [lock_key(service, i) for i, _ in locks]
    args = (
        [ttl, group_name(service), consumer, last, nonce]
        + [v for _, v in locks]
        + [flags]
        + [i for k, (i, _) in enumerate(locks) if not flags or flags[k : k + 1] == "1"]
    )
    return await r.eval(source("extend-n"), len(keys), *keys, *args)


async def requeue(
    r: aioredis.Redis,
    service: str,
    entry_id: str,
    mode: str = "absent",
    value: str = "",
    inc: str = "1",
    max_retries: str = "5",
    reason: str = "boom",
    force: str = "0",
    dlq: str = "1",
    delay: tuple[int, int, float] = (0, 0, 1.0),
) -> list[Any]:
    """One requeue-6.lua call; ``delay`` is (ms at retry 1, longest ms, jitter): (0, ...) re-queues at once."""
    keys = [
        input_stream(service),
        dead_letter_stream(service),
        lock_key(service, entry_id),
        delayed_stream(service),
        due_key(service),
    ]
    args = [
        group_name(service),
        entry_id,
        mode,
        value,
        inc,
        max_retries,
        "_retry_count",
        "_original_id",
        reason,
        "c1",
        force,
        dlq,
        "_",
        *delay,
    ]
    return await r.eval(source("requeue-6"), 5, *keys, *args)


async def promote(r: aioredis.Redis, service: str, batch: int = 100) -> list[int]:
    return await r.eval(
        source("promote-4"),
        4,
        due_key(service),
        delayed_stream(service),
        input_stream(service),
        waiting_key(service),
        batch,
        group_name(service),
        key_prefix(service),
    )


# -- state --------------------------------------------------------------------


async def lbs_with(r: aioredis.Redis, service: str, n: int) -> list[str]:
    """The LBS and its group, with ``n`` entries; their ids."""
    await r.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    return [
        (await r.xadd(input_stream(service), {"lbs-input": f'{{"stream":"s{i}"}}'})).decode()
        for i in range(n)
    ]


async def taken(
    r: aioredis.Redis, service: str, n: int, consumer: str = "c1"
) -> list[tuple[str, str]]:
    """``n`` entries read and locked by ``consumer``: (entry id, lock value) each."""
    await lbs_with(r, service, n)
    entries, tokens, _ = await read(r, service, consumer)
    assert all(isinstance(t, int) for t in tokens)
    return [(e[0].decode(), f"{t}:{consumer}") for e, t in zip(entries, tokens)]


async def snapshot(r: aioredis.Redis, service: str) -> dict[bytes, bytes | None]:
    """Every key of the service with its serialized value (DUMP ignores TTLs)."""
    return {k: await r.dump(k) async for k in r.scan_iter(match=f"*{service}*", count=1000)}


async def pending(r: aioredis.Redis, service: str) -> int:
    return int((await r.xpending(input_stream(service), group_name(service)))["pending"])


async def past(r: aioredis.Redis, due_ms: float) -> None:
    """Wait (without sleeping: what is due is the server's clock's call) until the server's time reaches ``due_ms``."""
    while us(await r.time()) // 1000 < due_ms:
        pass


async def refused(call: Any, *names: str) -> str:
    with pytest.raises(ResponseError) as info:
        await call
    message = str(info.value)
    assert message.startswith("LBSKEY "), message
    for name in names:
        assert name in message, message
    return message


# -- read-3.lua ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fence", "what"),
    [
        ("9223372036854775807", "holds 9223372036854775807: the fencing counter is past 2^53"),
        ("9007199254740992", "the fencing counter is past 2^53"),
        ("9007199254740990", "the fencing counter would pass 2^53"),  # + COUNT 10
        ("abc", "not a plain decimal integer"),
        ("-1", "not a plain decimal integer"),
        ("0123", "not a plain decimal integer"),  # INCRBY refuses a leading zero
        ("1.5", "not a plain decimal integer"),
    ],
)
async def test_read_refuses_a_bad_fence_before_delivering(
    rr: aioredis.Redis, service: str, fence: str, what: str
) -> None:
    await lbs_with(rr, service, 3)
    await rr.set(fence_key(service), fence)
    before = await snapshot(rr, service)
    message = await refused(read(rr, service), fence_key(service), what)
    assert "fencing counter" in message
    assert await pending(rr, service) == 0
    assert await snapshot(rr, service) == before
    assert await rr.get(fence_key(service)) == fence.encode()


async def test_read_takes_a_fence_just_below_2_53(rr: aioredis.Redis, service: str) -> None:
    await lbs_with(rr, service, 2)
    await rr.set(fence_key(service), str(2**53 - 11))  # + COUNT 10 = 2^53 - 1
    _, tokens, _ = await read(rr, service)
    assert tokens == [2**53 - 10, 2**53 - 9]


@pytest.mark.parametrize(
    ("key", "setup", "what"),
    [
        (fence_key, "rpush", "holds a list, not the fencing counter"),
        (consumers_key, "set", "holds a string, not the consumer deadline index"),
        (consumers_key, "rpush", "holds a list, not the consumer deadline index"),
    ],
)
async def test_read_refuses_a_key_of_the_wrong_type(
    rr: aioredis.Redis, service: str, key: Any, setup: str, what: str
) -> None:
    await lbs_with(rr, service, 3)
    name = key(service)
    await (rr.rpush(name, "x") if setup == "rpush" else rr.set(name, "x"))
    before = await snapshot(rr, service)
    await refused(read(rr, service), name, what)
    await refused(read(rr, service, start="0"), name, what)
    assert await pending(rr, service) == 0
    assert await snapshot(rr, service) == before


@pytest.mark.parametrize("fair_ms", [None, 5_000])
async def test_read_refuses_an_lbs_of_the_wrong_type(
    rr: aioredis.Redis, service: str, fair_ms: int | None
) -> None:
    await rr.hset(input_stream(service), "lbs-input", "{}")
    before = await snapshot(rr, service)
    await refused(
        read(rr, service, fair_ms=fair_ms),
        input_stream(service),
        "holds a hash, not the load-balancer stream",
    )
    assert await snapshot(rr, service) == before
    assert not await rr.exists(fence_key(service), consumers_key(service))


async def test_read_refuses_a_queued_set_of_the_wrong_type_before_delivering(
    rr: aioredis.Redis, service: str
) -> None:
    await lbs_with(rr, service, 2)
    queued = queued_prefix(service) + "c1"
    await rr.set(queued, "x")
    before = await snapshot(rr, service)
    args = [group_name(service), "c1", 10, TTL, lock_key(service, ""), ">", "", "", "", "", queued]
    with pytest.raises(
        ResponseError, match=f"LBSKEY {re.escape(queued)} holds a string, not a queued set"
    ):
        await rr.eval(
            source("read-3"),
            3,
            input_stream(service),
            fence_key(service),
            consumers_key(service),
            *args,
        )
    assert await snapshot(rr, service) == before  # nothing delivered, nothing locked
    await rr.delete(queued)
    reply = await rr.eval(
        source("read-3"),
        3,
        input_stream(service),
        fence_key(service),
        consumers_key(service),
        *args,
    )
    assert len(reply[0]) == 2 and await rr.scard(queued) == 2  # queued: merely held


async def test_a_lost_fence_is_seeded_from_the_clock_and_never_goes_back(
    rr: aioredis.Redis, service: str
) -> None:
    await lbs_with(rr, service, 3)
    at_call = us(await rr.time())
    entries, tokens, _ = await read(rr, service, count=3)
    assert len(tokens) == 3 and tokens[0] > at_call
    assert tokens == [tokens[0], tokens[0] + 1, tokens[0] + 2]
    assert await rr.get(fence_key(service)) == str(tokens[2]).encode()
    for (entry_id, _), token in zip(entries, tokens):  # 16 digits, printed in full
        assert await rr.get(lock_key(service, entry_id.decode())) == f"{token}:c1".encode()
    # The counter is lost (eviction, restart without persistence).
    await rr.delete(fence_key(service))
    # The seed is the clock; wait (without sleeping) until the server's clock
    # is past the tokens handed out, which a real loss always is by far.
    while us(await rr.time()) <= tokens[-1]:
        pass
    for _ in range(2):
        await rr.xadd(input_stream(service), {"lbs-input": "{}"})
    _, again, _ = await read(rr, service)
    assert len(again) == 2 and min(again) > max(tokens)


async def test_a_fence_that_went_back_moves_up_to_the_clock(
    rr: aioredis.Redis, service: str
) -> None:
    # A failover to a replica that missed the last tokens (asynchronous replication) leaves the
    # counter below tokens already handed out: the next take starts at the server time, above them.
    await lbs_with(rr, service, 2)
    _, tokens, _ = await read(rr, service)
    await rr.set(fence_key(service), str(tokens[0] - 1000))  # what the replica had
    while us(await rr.time()) <= tokens[-1]:
        pass
    await rr.xadd(input_stream(service), {"lbs-input": "{}"})
    _, again, _ = await read(rr, service)
    assert len(again) == 1 and again[0] > max(tokens)


async def test_lock_owner_argument(rr: aioredis.Redis, service: str) -> None:
    await lbs_with(rr, service, 2)
    entries, tokens, _ = await read(rr, service, count=1, owner="c1:nonce-a")
    assert (
        await rr.get(lock_key(service, entries[0][0].decode()))
        == f"{tokens[0]}:c1:nonce-a".encode()
    )
    entries, tokens, _ = await read(rr, service, count=1, owner="")
    assert await rr.get(lock_key(service, entries[0][0].decode())) == f"{tokens[0]}:c1".encode()


async def test_a_lock_key_of_another_type_is_reported_and_the_read_goes_on(
    rr: aioredis.Redis, service: str, msetex: str
) -> None:
    ids = await lbs_with(rr, service, 3)
    await rr.rpush(lock_key(service, ids[1]), "garbage")
    entries, tokens, then = await read(rr, service, msetex=msetex)
    assert [e[0].decode() for e in entries] == ids and then == b"drained"  # fewer than COUNT
    assert isinstance(tokens[0], int) and isinstance(tokens[2], int)
    assert tokens[1] == b"WRONGTYPE list"
    assert await pending(rr, service) == 3
    assert await rr.lrange(lock_key(service, ids[1]), 0, -1) == [b"garbage"]
    assert await rr.get(lock_key(service, ids[2])) == f"{tokens[2]}:c1".encode()
    assert await rr.zscore(consumers_key(service), "c1") is not None
    # The re-read after a lost reply reports the same.
    _, again, _ = await read(rr, service, start="0")
    assert again == [f"{tokens[0]}:c1".encode(), b"WRONGTYPE list", f"{tokens[2]}:c1".encode()]


async def test_the_re_read_lists_our_pending_entries_without_counting_a_delivery(
    rr: aioredis.Redis, service: str
) -> None:
    ids = await lbs_with(rr, service, 3)
    entries, tokens, _ = await read(rr, service)
    await rr.xdel(
        input_stream(service), ids[1]
    )  # a pending entry deleted: it comes back with no fields
    again, values, _ = await read(rr, service, start="0")
    assert (
        [e[0].decode() for e in again] == ids
        and again[1][1] is None
        and again[0][1] == entries[0][1]
    )
    assert values == [
        f"{tokens[0]}:c1".encode(),
        f"{tokens[1]}:c1".encode(),
        f"{tokens[2]}:c1".encode(),
    ]
    rows = await rr.xpending_range(input_stream(service), group_name(service), "-", "+", 10)
    assert [row["times_delivered"] for row in rows] == [
        1,
        1,
        1,
    ]  # a second delivery would read as a death


async def test_read_locks_every_entry_of_a_free_batch(
    rr: aioredis.Redis, service: str, msetex: str
) -> None:
    ids = await lbs_with(rr, service, 3)
    entries, tokens, _ = await read(rr, service, msetex=msetex)
    assert [e[0].decode() for e in entries] == ids
    assert tokens == [tokens[0], tokens[0] + 1, tokens[0] + 2]
    for entry_id, token in zip(ids, tokens):
        assert await rr.get(lock_key(service, entry_id)) == f"{token}:c1".encode()
        assert 0 < await rr.pttl(lock_key(service, entry_id)) <= TTL
    assert await rr.zscore(consumers_key(service), "c1") is not None


async def test_read_past_a_slice_with_one_held_lock(
    rr: aioredis.Redis, service: str, msetex: str
) -> None:
    """600 entries are two MSETEX slices (500 + 100); a held lock in the second
    makes only that slice fall back to SET NX per entry: it is reported, the
    other 599 are ours."""
    ids = await lbs_with(rr, service, 600)
    held = ids[550]
    await rr.set(lock_key(service, held), "7:someone")
    entries, tokens, _ = await read(rr, service, count=600, msetex=msetex)
    assert [e[0].decode() for e in entries] == ids
    assert tokens[550] == b"7:someone"
    ours = [t for i, t in enumerate(tokens) if i != 550]
    assert all(isinstance(t, int) for t in ours) and len(set(ours)) == 599
    assert await rr.get(lock_key(service, held)) == b"7:someone"
    values = await rr.mget([lock_key(service, i) for i in ids])
    assert [v for i, v in enumerate(values) if i != 550] == [f"{t}:c1".encode() for t in ours]


# -- done-n.lua ---------------------------------------------------------------


async def test_done_retry_flag_reports_what_a_lost_call_finished(
    any_server: Any, rr: aioredis.Redis, service: str, xackdel: str
) -> None:
    locks = await taken(rr, service, 3)
    assert await done(rr, service, locks[:2], xackdel) == [1, 1]
    assert await rr.xlen(input_stream(service)) == 1
    before = await snapshot(rr, service)
    assert await done(rr, service, locks[:2], xackdel, retry="1") == [4, 4]
    assert await done(rr, service, locks[:2], xackdel, retry="0") == [3, 3]
    assert await snapshot(rr, service) == before
    # A lock that expired while its entry is still pending: 2, flag or not.
    await rr.delete(lock_key(service, locks[2][0]))
    assert await done(rr, service, locks[2:], xackdel, retry="1") == [2]
    assert await pending(rr, service) == 0 and await rr.xlen(input_stream(service)) == 0


async def test_done_leaves_a_lock_of_another_type_and_its_entry(
    any_server: Any, rr: aioredis.Redis, service: str, xackdel: str
) -> None:
    locks = await taken(rr, service, 2)
    bad = lock_key(service, locks[0][0])
    await rr.delete(bad)
    await rr.hset(bad, "x", "1")
    assert await done(rr, service, locks, xackdel, retry="1") == [3, 1]
    assert await rr.type(bad) == b"hash"
    assert await pending(rr, service) == 1
    assert [i.decode() for i, _ in await rr.xrange(input_stream(service))] == [locks[0][0]]


async def test_done_refuses_the_old_argument_layout(rr: aioredis.Redis, service: str) -> None:
    locks = await taken(rr, service, 1)
    before = await snapshot(rr, service)
    keys = [input_stream(service), lock_key(service, locks[0][0])]
    with pytest.raises(ResponseError, match="done-n"):
        await rr.eval(
            source("done-n"), 2, *keys, group_name(service), "0", locks[0][1], locks[0][0]
        )
    assert await snapshot(rr, service) == before


# -- extend-n.lua -------------------------------------------------------------


async def test_extend_sets_and_refreshes_its_instance_marker(
    rr: aioredis.Redis, service: str
) -> None:
    locks = await taken(rr, service, 2)
    marker = lease_key(service, "c1")
    assert await extend(rr, service, locks, nonce="n1") == []
    assert await rr.get(marker) == b"n1" and 0 < await rr.pttl(marker) <= TTL
    await rr.pexpire(marker, 5_000)
    assert await extend(rr, service, locks, nonce="n1") == []
    assert await rr.pttl(marker) > 5_000
    # Not the last call of a tick: the marker is not looked at.
    await rr.pexpire(marker, 5_000)
    assert await extend(rr, service, locks, last="0", nonce="other") == []
    assert await rr.get(marker) == b"n1" and await rr.pttl(marker) <= 5_000


async def test_extend_reports_another_instance_and_still_extends(
    rr: aioredis.Redis, service: str
) -> None:
    locks = await taken(rr, service, 2)
    marker = lease_key(service, "c1")
    await rr.set(marker, "n2", px=30_000)
    for entry_id, _ in locks:
        await rr.pexpire(lock_key(service, entry_id), 5_000)
    assert await extend(rr, service, locks, nonce="n1") == [b"INSTANCE n2"]
    assert await rr.get(marker) == b"n2" and await rr.pttl(marker) <= 30_000
    for entry_id, _ in locks:
        assert await rr.pttl(lock_key(service, entry_id)) > 5_000


async def test_extend_with_no_locks(rr: aioredis.Redis, service: str) -> None:
    await lbs_with(rr, service, 0)
    marker = lease_key(service, "c1")
    assert await extend(rr, service, [], nonce="n1") == []
    assert await rr.get(marker) == b"n1"
    assert not await rr.exists(consumers_key(service))  # holding nothing: not added
    await rr.zadd(consumers_key(service), {"c1": 1})
    assert await extend(rr, service, [], nonce="n1") == []
    assert (await rr.zscore(consumers_key(service), "c1") or 0) > 1  # already in: moved


async def test_extend_reports_keys_of_the_wrong_type(rr: aioredis.Redis, service: str) -> None:
    locks = await taken(rr, service, 3)
    await rr.delete(consumers_key(service))
    await rr.set(consumers_key(service), "x")
    await rr.rpush(lease_key(service, "c1"), "x")
    bad = lock_key(service, locks[1][0])
    await rr.delete(bad)
    await rr.sadd(bad, "x")
    for entry_id, _ in locks:
        await rr.pexpire(lock_key(service, entry_id), 5_000)
    out = await extend(rr, service, locks)
    assert out == [
        2,
        f"LBSKEY {consumers_key(service)} holds a string, not the consumer deadline index".encode(),
        f"LBSKEY {lease_key(service, 'c1')} holds a list, not an instance marker".encode(),
    ]
    assert await rr.get(consumers_key(service)) == b"x"
    assert await rr.lrange(lease_key(service, "c1"), 0, -1) == [b"x"]
    assert await rr.type(bad) == b"set" and await rr.pttl(bad) <= 5_000
    assert await rr.pttl(lock_key(service, locks[0][0])) > 5_000
    assert await rr.pttl(lock_key(service, locks[2][0])) > 5_000


async def test_extend_refreshes_the_flagged_entries_only_whatever_locks_are_lost_between(
    rr: aioredis.Redis, service: str
) -> None:
    """Only the flagged entries' ids are sent: each goes to its own entry, lost locks in between."""
    locks = await taken(rr, service, 4)
    for k in (1, 2):  # one unflagged, one flagged lock lost
        await rr.set(lock_key(service, locks[k][0]), "9:someone-else")
    await asyncio.sleep(0.05)  # every entry idle for a while
    assert await extend(rr, service, locks, flags="1011") == [2, 3]
    idle = {
        p["message_id"].decode(): p["time_since_delivered"]
        for p in await rr.xpending_range(input_stream(service), group_name(service), "-", "+", 10)
    }
    fresh = [idle[locks[k][0]] for k in (0, 3)]
    stale = [idle[locks[k][0]] for k in (1, 2)]
    assert max(fresh) < min(stale)
    with pytest.raises(ResponseError, match=r"extend-n.*flags"):
        await extend(rr, service, locks, flags="101")


# -- requeue-6.lua ------------------------------------------------------------


async def test_requeue_with_a_dead_letter_key_of_another_type_touches_nothing(
    rr: aioredis.Redis, service: str
) -> None:
    ((entry_id, _),) = await taken(rr, service, 1)
    await rr.delete(lock_key(service, entry_id))
    dlq = dead_letter_stream(service)
    await rr.set(dlq, "not a stream")
    before = await snapshot(rr, service)
    code, message = await requeue(rr, service, entry_id, force="1")
    assert code == -2
    assert message == f"LBSKEY {dlq} holds a string, not a stream".encode()
    assert await pending(rr, service) == 1 and await rr.xlen(input_stream(service)) == 1
    assert await snapshot(rr, service) == before
    await rr.delete(dlq)
    out = await requeue(rr, service, entry_id, force="1")
    assert out[0] == 2 and await rr.xlen(dlq) == 1
    assert await pending(rr, service) == 0 and await rr.xlen(input_stream(service)) == 0


async def test_requeue_past_max_retries_checks_the_dead_letter_key(
    rr: aioredis.Redis, service: str
) -> None:
    ((entry_id, _),) = await taken(rr, service, 1)
    await rr.delete(lock_key(service, entry_id))
    await rr.rpush(dead_letter_stream(service), "x")
    before = await snapshot(rr, service)
    assert (await requeue(rr, service, entry_id, max_retries="0"))[0] == -2
    assert await snapshot(rr, service) == before
    # A re-queue (retries left) does not need the dead-letter stream.
    out = await requeue(rr, service, entry_id, max_retries="5")
    assert out[0] == 1 and await pending(rr, service) == 0


async def test_requeue_never_dead_letters_a_keys_registration_for_its_retries(
    rr: aioredis.Redis, service: str
) -> None:
    """A key counts failures per message (commit-1.lua's skip): its registration goes round."""
    entry_id, _ = await delivered_wide_entry(
        rr,
        service,
        {"lbs-input": '{"DataStreamName":"k","Info":{}}', "lbs-keyed": "1", "_retry_count": "9"},
    )
    await rr.delete(lock_key(service, entry_id))
    out = await requeue(rr, service, entry_id, max_retries="3")
    assert out[0] == 1
    ((_, fields),) = await rr.xrange(input_stream(service))
    assert fields[b"lbs-keyed"] == b"1" and fields[b"_retry_count"] == b"10"
    assert await rr.xlen(dead_letter_stream(service)) == 0


async def delivered_wide_entry(
    rr: aioredis.Redis, service: str, fields: dict[str, str]
) -> tuple[str, int]:
    """XADD one entry with ``fields`` into a fresh LBS and deliver it (read-3.lua): its id and token."""
    await rr.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    entry_id = (await rr.xadd(input_stream(service), fields)).decode()  # type: ignore[arg-type]
    _, (token,), _ = await read(rr, service)
    return entry_id, token


async def test_requeue_an_entry_too_big_to_copy_dead_letters_and_keeps_it(
    rr: aioredis.Redis, service: str
) -> None:
    stream = input_stream(service)
    fields: dict[str, str] = {"lbs-input": '{"stream":"huge"}'}
    fields.update({f"f{i}": str(i) for i in range(9_999)})
    entry_id, token = await delivered_wide_entry(rr, service, fields)
    out = await requeue(rr, service, entry_id, mode="owned", value=f"{token}:c1", max_retries="5")
    assert out[0] == 2 and out[2] == b'{"stream":"huge"}' and out[3] == 1
    ((dl_id, dl),) = await rr.xrange(dead_letter_stream(service))
    assert dl_id == out[1]
    assert dl == {
        b"lbs-input": b'{"stream":"huge"}',
        b"_retry_count": b"1",
        b"_original_id": entry_id.encode(),
        b"_reason": f"entry has 10000 fields, too many to copy; kept in {stream} as {entry_id}; boom".encode(),
        b"_consumer": b"c1",
        b"_failed_id": entry_id.encode(),
    }
    assert await pending(rr, service) == 0
    assert not await rr.exists(lock_key(service, entry_id))
    ((kept_id, kept),) = await rr.xrange(stream)
    assert kept_id.decode() == entry_id and len(kept) == 10_000
    # The record stays: a late done-n (lock gone, not pending) does not delete it.
    assert await done(rr, service, [(entry_id, f"{token}:c1")]) == [3]
    assert await rr.xlen(stream) == 1


async def test_requeue_an_entry_too_big_without_a_dead_letter_stream(
    rr: aioredis.Redis, service: str
) -> None:
    stream = input_stream(service)
    entry_id, _ = await delivered_wide_entry(rr, service, {f"f{i}": "v" for i in range(4_000)})
    await rr.delete(lock_key(service, entry_id))
    assert await requeue(rr, service, entry_id, dlq="0", reason="") == [3, b"", b"", 1]
    assert await pending(rr, service) == 0 and await rr.xlen(stream) == 1
    assert not await rr.exists(dead_letter_stream(service))


async def test_requeue_just_below_the_copy_bound_copies(rr: aioredis.Redis, service: str) -> None:
    stream = input_stream(service)
    entry_id, _ = await delivered_wide_entry(rr, service, {f"f{i}": "v" for i in range(3_494)})
    await rr.delete(lock_key(service, entry_id))
    # A death counted (delivered, its holder gone): 6,988 values + 12 (with _deaths) = 7,000.
    out = await requeue(rr, service, entry_id, force="1")
    assert out[0] == 2
    ((_, dl),) = await rr.xrange(dead_letter_stream(service))
    assert (
        len(dl) == 3_494 + 6 and dl[b"_reason"] == b"boom" and dl[b"_deaths"] == entry_id.encode()
    )
    assert await rr.xlen(stream) == 0


@pytest.mark.parametrize("mode", ["owned", "absent"])
async def test_requeue_a_lock_key_of_another_type_is_someone_elses(
    rr: aioredis.Redis, service: str, mode: str
) -> None:
    ((entry_id, value),) = await taken(rr, service, 1)
    await rr.delete(lock_key(service, entry_id))
    await rr.rpush(lock_key(service, entry_id), value)
    before = await snapshot(rr, service)
    assert await requeue(rr, service, entry_id, mode=mode, value=value) == [0, b"lock"]
    assert await snapshot(rr, service) == before


async def test_requeue_adds_before_it_acks(rr: aioredis.Redis, service: str) -> None:
    ((entry_id, value),) = await taken(rr, service, 1)
    code, new_id, lbs_input, retries = await requeue(
        rr, service, entry_id, mode="owned", value=value
    )
    assert code == 1 and retries == 1 and lbs_input == b'{"stream":"s0"}'
    ((got_id, got),) = await rr.xrange(input_stream(service))
    assert got_id == new_id
    assert got == {
        b"lbs-input": b'{"stream":"s0"}',
        b"_retry_count": b"1",
        b"_original_id": entry_id.encode(),
    }
    assert await pending(rr, service) == 0 and not await rr.exists(lock_key(service, entry_id))


async def test_requeue_of_an_entry_no_longer_pending(rr: aioredis.Redis, service: str) -> None:
    ((entry_id, value),) = await taken(rr, service, 1)
    await rr.xack(input_stream(service), group_name(service), entry_id)
    assert await requeue(rr, service, entry_id, mode="owned", value=value) == [0, b"acked"]
    assert not await rr.exists(lock_key(service, entry_id))  # ours: released
    assert await rr.xlen(input_stream(service)) == 1  # not deleted


async def test_requeue_of_a_trimmed_entry(rr: aioredis.Redis, service: str) -> None:
    ((entry_id, value),) = await taken(rr, service, 1)
    await rr.xdel(input_stream(service), entry_id)
    assert await requeue(rr, service, entry_id, mode="owned", value=value) == [-1, b"trimmed"]
    assert await pending(rr, service) == 0 and not await rr.exists(lock_key(service, entry_id))


@pytest.mark.parametrize(
    ("key", "setup", "what"),
    [
        (delayed_stream, "set", "holds a string, not a stream"),
        (delayed_stream, "rpush", "holds a list, not a stream"),
        (due_key, "set", "holds a string, not the due index"),
        (due_key, "hset", "holds a hash, not the due index"),
    ],
)
async def test_requeue_parking_refuses_keys_of_the_wrong_type(
    rr: aioredis.Redis, service: str, key: Any, setup: str, what: str
) -> None:
    ((entry_id, value),) = await taken(rr, service, 1)
    name = key(service)
    await (
        rr.rpush(name, "x")
        if setup == "rpush"
        else rr.hset(name, "x", "1")
        if setup == "hset"
        else rr.set(name, "x")
    )
    before = await snapshot(rr, service)
    code, message = await requeue(
        rr, service, entry_id, mode="owned", value=value, delay=(1000, 60_000, 1.0)
    )
    assert code == -2 and message == f"LBSKEY {name} {what}".encode()
    assert await snapshot(rr, service) == before
    assert await pending(rr, service) == 1
    # At once (no delay), neither key is needed; past max retries neither is either.
    out = await requeue(
        rr, service, entry_id, mode="owned", value=value, max_retries="0", delay=(1000, 60_000, 1.0)
    )
    assert out[0] == 2 and await pending(rr, service) == 0


async def test_requeue_parks_the_copy_for_its_delay(rr: aioredis.Redis, service: str) -> None:
    ((entry_id, value),) = await taken(rr, service, 1)
    # Retry count 1 after this call: d = min(400 * 2^0, 1000) = 400, jittered by 0.5: 200 ms.
    code, parked_id, lbs_input, retries, delay = await requeue(
        rr, service, entry_id, mode="owned", value=value, delay=(400, 1000, 0.5)
    )
    assert (code, lbs_input, retries, delay) == (4, b'{"stream":"s0"}', 1, 200)
    ((got_id, got),) = await rr.xrange(delayed_stream(service))
    assert got_id == parked_id
    assert got == {
        b"lbs-input": b'{"stream":"s0"}',
        b"_retry_count": b"1",
        b"_original_id": entry_id.encode(),
    }
    # Due exactly the delay after the parked id's milliseconds (the server's clock when it was parked).
    parked_ms = int(parked_id.split(b"-")[0])
    assert await rr.zrange(due_key(service), 0, -1, withscores=True) == [
        (parked_id, parked_ms + 200)
    ]
    assert await pending(rr, service) == 0 and await rr.xlen(input_stream(service)) == 0
    assert not await rr.exists(lock_key(service, entry_id))


@pytest.mark.parametrize(
    ("retries", "first", "most", "jitter", "expected"),
    [
        (0, 100, 10_000, 1.0, 100),  # retry 1: the first delay
        (1, 100, 10_000, 1.0, 200),  # retry 2: doubled
        (3, 100, 10_000, 0.75, 600),  # retry 4: 800, jittered by 0.75
        (9, 100, 10_000, 1.0, 10_000),  # retry 10: 51,200, capped
        (9, 100, 10_000, 0.5, 5_000),
    ],
)
async def test_requeue_delay_doubles_per_retry_up_to_the_cap(
    rr: aioredis.Redis,
    service: str,
    retries: int,
    first: int,
    most: int,
    jitter: float,
    expected: int,
) -> None:
    await rr.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    await rr.xadd(
        input_stream(service), {"lbs-input": '{"stream":"s"}', "_retry_count": str(retries)}
    )
    ((entry_id, _),), _, _ = await read(rr, service)
    out = await requeue(
        rr, service, entry_id.decode(), mode="any", max_retries="-1", delay=(first, most, jitter)
    )
    assert out[0] == 4 and out[3] == retries + 1 and out[4] == expected


async def test_promote_refuses_keys_of_the_wrong_type(rr: aioredis.Redis, service: str) -> None:
    ((entry_id, value),) = await taken(rr, service, 1)
    parked_id = (
        await requeue(rr, service, entry_id, mode="owned", value=value, delay=(1, 1, 1.0))
    )[1]
    await past(
        rr, await rr.zscore(due_key(service), parked_id) or 0
    )  # due: the other keys are looked at
    for key, what in [
        (due_key(service), "the due index"),
        (delayed_stream(service), "a stream"),
        (input_stream(service), "the load-balancer stream"),
    ]:
        saved = await rr.dump(key)
        await rr.delete(key)
        await rr.set(key, "x")
        before = await snapshot(rr, service)
        await refused(promote(rr, service), key, f"holds a string, not {what}")
        assert await snapshot(rr, service) == before
        await rr.delete(key)
        await rr.restore(key, 0, saved)
    with pytest.raises(ResponseError, match="promote-4"):
        await promote(rr, service, batch=0)
    assert await promote(rr, service) == [1, 0, -1, 0, 0]
    # Nothing parked: nothing looked at, whatever the other keys hold.
    await rr.delete(delayed_stream(service))
    await rr.set(delayed_stream(service), "x")
    assert await promote(rr, service) == [0, 0, -1, 0, 0]


async def test_promote_moves_only_what_is_due_and_drops_vanished_ids(
    rr: aioredis.Redis, service: str
) -> None:
    locks = await taken(rr, service, 3)
    parked = [
        (await requeue(rr, service, entry_id, mode="owned", value=value, delay=(ms, ms, 1.0)))[1]
        for (entry_id, value), ms in zip(locks, (1, 1, 3_600_000))
    ]
    await rr.xdel(
        delayed_stream(service), parked[1]
    )  # gone by hand: its due id is dropped, nothing added
    await past(rr, max([await rr.zscore(due_key(service), p) or 0 for p in parked[:2]]))
    moved, vanished, next_ms, stuck, _ = await promote(rr, service)
    assert (moved, vanished, stuck) == (1, 1, 0) and 0 < next_ms <= 3_600_000
    ((_, fields),) = await rr.xrange(input_stream(service))
    assert fields == {
        b"lbs-input": b'{"stream":"s0"}',
        b"_retry_count": b"1",
        b"_original_id": locks[0][0].encode(),
    }
    assert [i for i, _ in await rr.xrange(delayed_stream(service))] == [parked[2]]
    assert await rr.zrange(due_key(service), 0, -1) == [parked[2]]
    assert (await promote(rr, service))[:2] == [0, 0]


async def test_promote_a_full_batch_asks_to_be_called_again(
    rr: aioredis.Redis, service: str
) -> None:
    locks = await taken(rr, service, 3)
    for entry_id, value in locks:
        await requeue(rr, service, entry_id, mode="owned", value=value, delay=(1, 1, 1.0))
    await past(rr, max(s for _, s in await rr.zrange(due_key(service), 0, -1, withscores=True)))
    assert await promote(rr, service, batch=2) == [2, 0, 0, 0, 0]
    assert await promote(rr, service, batch=2) == [1, 0, -1, 0, 0]
    assert await rr.xlen(input_stream(service)) == 3 and await rr.xlen(delayed_stream(service)) == 0
    assert not await rr.exists(due_key(service))


async def test_promote_leaves_an_entry_too_wide_to_copy_parked(
    rr: aioredis.Redis, service: str
) -> None:
    await rr.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    wide = (await rr.xadd(delayed_stream(service), {f"f{i}": "v" for i in range(3_501)})).decode()
    await rr.zadd(due_key(service), {wide: 0})
    assert await promote(rr, service) == [0, 0, -1, 1, 0]
    assert await rr.zscore(due_key(service), wide) == float("inf")
    assert await rr.xlen(delayed_stream(service)) == 1 and await rr.xlen(input_stream(service)) == 0


# -- reap-4.lua ---------------------------------------------------------------


async def dead(r: aioredis.Redis, service: str, n: int) -> list[str]:
    """``n`` entries c1 read and locked, then c1 dead: its locks gone, its deadline passed."""
    ids = [i for i, _ in await taken(r, service, n)]
    await r.delete(*[lock_key(service, i) for i in ids])
    await r.zadd(consumers_key(service), {"c1": 1})
    return ids


@pytest.mark.parametrize(
    "key, kind, what",
    [
        (fence_key, "hash", "not the fencing counter"),
        (lambda service: queued_prefix(service) + "c2", "hash", "not a queued set"),
    ],
)
async def test_reap_refuses_an_adoption_key_of_another_type(
    rr: aioredis.Redis, service: str, key: Any, kind: str, what: str
) -> None:
    await dead(rr, service, 2)
    name = key(service)
    await rr.delete(name)
    await rr.hset(name, "x", "1")
    before = await snapshot(rr, service)
    await refused(reap(rr, service, "c2", 10, queues="1"), name, what)
    assert await snapshot(rr, service) == before


async def test_reap_adopts_under_fresh_tokens_and_counts_a_death_only_against_what_was_running(
    rr: aioredis.Redis, service: str
) -> None:
    ids = await dead(rr, service, 5)
    await rr.sadd(
        queued_prefix(service) + "c1", ids[0], ids[1]
    )  # merely held by c1: no death counted
    fence = int(await rr.get(fence_key(service)))
    entries, tokens, gone, trimmed, _next, holders, deadlines = await reap(
        rr, service, "c2", 4, queues="1"
    )
    assert len(entries) == 4 and gone == [ids[4].encode()] and trimmed == 0  # no room for the fifth
    assert holders == [b"c1"] * 5 and deadlines == [b"c1", b"1"]  # for the journal
    first = min(tokens)  # above the counter, and the clock (the counter never stays behind it)
    assert first > fence and sorted(tokens) == [first, first + 1, first + 2, first + 3]
    deaths = {e[0].decode(): e[3] for e in entries}
    for entry_id, token in zip([e[0].decode() for e in entries], tokens):
        assert await rr.get(lock_key(service, entry_id)) == f"{token}:c2:n".encode()
    assert deaths == {ids[0]: 0, ids[1]: 0, ids[2]: 1, ids[3]: 1}
    info = {
        p["message_id"].decode(): p
        for p in await rr.xpending_range(input_stream(service), group_name(service), "-", "+", 10)
    }
    assert [info[i]["consumer"] for i in ids] == [b"c2"] * 4 + [b"c1"]
    assert [info[i]["times_delivered"] for i in ids[:4]] == [1, 1, 2, 2]
    assert await rr.smembers(queued_prefix(service) + "c2") == {i.encode() for i in ids[:4]}
    assert not await rr.exists(queued_prefix(service) + "c1")
    assert await rr.zscore(consumers_key(service), "c2") is not None
    # The death counted in the delivery count goes into the copy when the entry is re-queued later.
    await rr.delete(lock_key(service, ids[2]))
    code, _new, _input, retries = await requeue(rr, service, ids[2], inc="0")
    assert (code, retries) == (1, 1)


# -- reap-4.lua, without adoption ------------------------------------------------


async def test_reap_refuses_a_deadline_index_of_another_type(
    rr: aioredis.Redis, service: str
) -> None:
    await taken(rr, service, 2)
    await rr.delete(consumers_key(service))
    await rr.hset(consumers_key(service), "c1", "0")
    before = await snapshot(rr, service)
    await refused(
        reap(rr, service), consumers_key(service), "holds a hash, not the consumer deadline index"
    )
    assert await snapshot(rr, service) == before
