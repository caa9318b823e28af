"""The Lua scripts check every precondition before their first write.

Each script is called directly (EVAL of ``lbs._redis.scripts.source``) against a
real server with one key of the service set to something it must not hold, or
with the consumer's lease not holding the value the call is made under: the
call is refused with an error (or an output) naming what is wrong, and a DUMP
of every key of the service shows that nothing was written. Redis does not
roll back a script that fails part-way, so "refused" must mean "untouched".
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError

from lbs._keys import (
    consumers_key,
    dead_letter_stream,
    delayed_stream,
    due_key,
    fence_key,
    go_lock_key,
    group_name,
    hash_tag,
    input_stream,
    key_prefix,
    lease_key,
    name_holder,
    reaped_key,
    tokens_prefix,
    waiting_key,
)
from lbs._redis.scripts import done_codes, source

from _helpers import reap, requeue_keys, requeue_switches

pytestmark = pytest.mark.timeout(60)

TTL = 60_000
#: The lease value a consumer's calls are made under (its process's instance nonce).
NONCE = "n1"

#: A consumer's lease that is not its own: what it holds, and the "LEASE ..." words that say so.
LEASE_LOST = [
    pytest.param("absent", "LEASE ", id="absent"),
    pytest.param("another", "LEASE n2", id="another"),
    pytest.param("list", "LEASE WRONGTYPE list", id="list"),
    pytest.param("hash", "LEASE WRONGTYPE hash", id="hash"),
]


@pytest.fixture(params=["0", "1"])
def xackdel(request: pytest.FixtureRequest, any_server: Any) -> str:
    """done-n.lua's XACKDEL flag: both on Redis 8.x, XACK + XDEL only on 7.0 and Valkey 9.1."""
    if request.param == "1" and not any_server.xackdel:
        pytest.skip(f"XACKDEL needs Redis >= 8.2, not {any_server.name}")
    return str(request.param)


def us(t: tuple[int, int]) -> int:
    return t[0] * 1_000_000 + t[1]


# -- calling the scripts ------------------------------------------------------


async def read(
    r: aioredis.Redis,
    service: str,
    consumer: str = "c1",
    count: int | str = 10,
    lease: str = NONCE,
    tokens: str = "",
) -> Any:
    """One read-3.lua call (the re-read of ``consumer``'s own pending entries after a lost reply) under
    ``lease`` (its lease key must hold it): [entries, tokens]."""
    return await r.eval(
        source("read-3"),
        3,
        input_stream(service),
        fence_key(service),
        lease_key(service, consumer),
        group_name(service),
        consumer,
        count,
        lease,
        tokens,
    )


async def deliver(
    r: aioredis.Redis, service: str, consumer: str = "c1", names: bool = False
) -> tuple[list[Any], list[int]]:
    """What the Lua-free read does: new entries delivered to ``consumer`` (XREADGROUP >), one token
    for the batch (fence-1.lua's floor, then INCRBY) and, with ``names``, their names taken
    (names-1.lua): (entries, one token per entry)."""
    reply = await r.xreadgroup(
        group_name(service), consumer, {input_stream(service): ">"}, count=100
    )
    entries = reply[0][1] if reply else []
    if not entries:
        return [], []
    await r.eval(source("fence-1"), 1, fence_key(service))
    token = await r.incrby(fence_key(service), 1)
    if names:
        pairs = []
        for entry_id, fields in entries:
            pairs += [json.loads(fields[b"lbs-input"])["DataStreamName"], entry_id]
        held = await r.eval(
            source("names-1"),
            1,
            input_stream(service),
            group_name(service),
            key_prefix(service),
            *pairs,
        )
        assert all(h == b"" for h in held), held
    return entries, [token] * len(entries)


def tokens_key(service: str, consumer: str = "c1") -> str:
    """``consumer``'s token records."""
    return tokens_prefix(service) + consumer


async def done(
    r: aioredis.Redis,
    service: str,
    ids: list[str],
    xackdel: str = "0",
    retry: str = "0",
    names: list[str] | None = None,
    consumer: str = "c1",
    lease: str = NONCE,
) -> list[int]:
    """One done-n.lua call by ``consumer`` under ``lease``; with ``names`` (each entry's
    DataStreamName) it releases them."""
    keys = [input_stream(service), lease_key(service, consumer)]
    args = [group_name(service), xackdel, retry, key_prefix(service) if names else "", consumer]
    args += [lease, "0", *ids]
    args += [name_holder(service, n) if n else "" for n in names or [""] * len(ids)]
    return done_codes(await r.eval(source("done-n"), len(keys), *keys, *args))


async def extend(
    r: aioredis.Redis,
    service: str,
    consumer: str = "c1",
    lease: str = NONCE,
    ttl: int = TTL,
    go: tuple[int, list[str], list[str]] | None = None,
) -> list[Any]:
    """One extend-n.lua call; beside a Go fleet ``go`` is (Go TTL, entry ids, their Go-style lock keys)."""
    keys = [input_stream(service), consumers_key(service), lease_key(service, consumer)]
    args: list[Any] = [ttl, group_name(service), consumer, lease]
    if go is not None:
        args += [go[0], *go[1], *go[2]]
    return await r.eval(source("extend-n"), len(keys), *keys, *args)


async def requeue(
    r: aioredis.Redis,
    service: str,
    entry_id: str,
    mode: str = "absent",
    value: str = NONCE,
    inc: str = "1",
    max_retries: str = "5",
    reason: str = "boom",
    force: str = "0",
    dlq: str = "1",
    delay: tuple[int, int, float] = (0, 0, 1.0),
    consumer: str = "c1",
) -> list[Any]:
    """One requeue-6.lua call (no pardons: KEYS[6] left out); ``value`` is ``consumer``'s lease value
    (modes "owned" and "restart"); ``delay`` is (ms at retry 1, longest ms, jitter): (0, ...) re-queues
    at once."""
    keys = requeue_keys(service)
    options = requeue_switches(service, consumer, int(max_retries), dlq == "1")
    args = [
        options,
        mode,
        value,
        inc,
        force,
        "",
        delay[0],
        delay[1],
        entry_id,
        reason,
        delay[2],
        "",
        0,
    ]
    (reply,) = await r.eval(source("requeue-6"), 5, *keys, *args)
    return reply


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


async def set_lease(
    r: aioredis.Redis, service: str, state: str = "ours", consumer: str = "c1", ttl: int = TTL
) -> None:
    """``consumer``'s lease key made to hold: "ours" (:data:`NONCE`), "another" (another process's
    nonce), "absent" (gone: expired or deleted), "list" or "hash" (a key of another type)."""
    key = lease_key(service, consumer)
    await r.delete(key)
    if state == "ours":
        await r.set(key, NONCE, px=ttl)
    elif state == "another":
        await r.set(key, "n2", px=ttl)
    elif state == "list":
        await r.rpush(key, NONCE)
    elif state == "hash":
        await r.hset(key, NONCE, NONCE)
    else:
        assert state == "absent", state


async def lbs_with(r: aioredis.Redis, service: str, n: int, consumer: str = "c1") -> list[str]:
    """The LBS and its group, with ``n`` entries, and ``consumer``'s lease holding :data:`NONCE`; the ids."""
    await r.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    await set_lease(r, service, "ours", consumer)
    return [
        (await r.xadd(input_stream(service), {"lbs-input": f'{{"stream":"s{i}"}}'})).decode()
        for i in range(n)
    ]


async def taken(r: aioredis.Redis, service: str, n: int, consumer: str = "c1") -> list[str]:
    """``n`` entries read by ``consumer`` under its lease (:data:`NONCE`): their ids."""
    await lbs_with(r, service, n, consumer)
    entries, _ = await deliver(r, service, consumer)
    return [e[0].decode() for e in entries]


async def named(r: aioredis.Redis, service: str, names: list[str]) -> list[str]:
    """One registration per name read by c1 under its lease, one holder per name: their ids."""
    await lbs_with(r, service, 0)
    ids = [
        (
            await r.xadd(
                input_stream(service), {"lbs-input": f'{{"DataStreamName":"{n}","Info":{{}}}}'}
            )
        ).decode()
        for n in names
    ]
    await deliver(r, service, names=True)
    return ids


async def snapshot(r: aioredis.Redis, service: str) -> dict[bytes, bytes | None]:
    """Every key of the service with its serialized value (DUMP ignores TTLs)."""
    return {k: await r.dump(k) async for k in r.scan_iter(match=f"*{service}*", count=1000)}


async def pending(r: aioredis.Redis, service: str) -> int:
    return int((await r.xpending(input_stream(service), group_name(service)))["pending"])


async def pending_to(r: aioredis.Redis, service: str) -> dict[str, bytes]:
    """Each pending entry's id and the consumer it is pending to."""
    rows = await r.xpending_range(input_stream(service), group_name(service), "-", "+", 1000)
    return {row["message_id"].decode(): row["consumer"] for row in rows}


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


# -- read-3.lua (the re-read after a lost reply) ------------------------------


@pytest.mark.parametrize(("state", "words"), LEASE_LOST)
async def test_read_refuses_under_a_lease_it_does_not_hold_and_writes_nothing(
    rr: aioredis.Redis, service: str, state: str, words: str
) -> None:
    """The lease is checked first: entries listed under a lease that does not hold ARGV[4] would be
    held by nobody (recovery may take them at any moment)."""
    ids = await lbs_with(rr, service, 4)
    await deliver(rr, service)  # four pending to c1
    await set_lease(rr, service, state)
    tokens = tokens_key(service)
    before = await snapshot(rr, service)
    with pytest.raises(ResponseError) as info:
        await read(rr, service, tokens=tokens)
    assert str(info.value) == words
    assert await snapshot(rr, service) == before
    if state == "absent":  # an empty value is no lease either
        with pytest.raises(ResponseError, match=r"^LEASE $"):
            await read(rr, service, lease="")
        assert await snapshot(rr, service) == before
    # The same call under the lease it holds re-reads.
    await set_lease(rr, service)
    entries, got = await read(rr, service, tokens=tokens)
    assert [e[0].decode() for e in entries] == ids and all(isinstance(t, int) for t in got)


@pytest.mark.parametrize("count", ["0", "-1", "abc", "1.5", "", "1" * 16])
async def test_read_refuses_a_malformed_count(rr: aioredis.Redis, service: str, count: str) -> None:
    await taken(rr, service, 2)
    before = await snapshot(rr, service)
    with pytest.raises(ResponseError, match=r"^lbs read-3: COUNT \(ARGV\[3\]\)"):
        await read(rr, service, count=count)
    assert await snapshot(rr, service) == before


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
async def test_read_refuses_a_bad_fence_before_writing(
    rr: aioredis.Redis, service: str, fence: str, what: str
) -> None:
    await taken(rr, service, 3)
    await rr.set(fence_key(service), fence)
    before = await snapshot(rr, service)
    message = await refused(read(rr, service, tokens=tokens_key(service)), fence_key(service), what)
    assert "fencing counter" in message
    assert await snapshot(rr, service) == before
    assert await rr.get(fence_key(service)) == fence.encode()


async def test_read_takes_a_fence_just_below_2_53(rr: aioredis.Redis, service: str) -> None:
    await taken(rr, service, 2)
    await rr.set(fence_key(service), str(2**53 - 11))  # + COUNT 10 = 2^53 - 1
    _, tokens = await read(rr, service)
    assert tokens == [2**53 - 10, 2**53 - 10]  # one token per batch


@pytest.mark.parametrize(
    ("setup", "what"),
    [
        ("rpush", "holds a list, not the fencing counter"),
        ("hset", "holds a hash, not the fencing counter"),
    ],
)
async def test_read_refuses_a_fence_of_the_wrong_type(
    rr: aioredis.Redis, service: str, setup: str, what: str
) -> None:
    await taken(rr, service, 3)
    name = fence_key(service)
    await rr.delete(name)
    await (rr.rpush(name, "x") if setup == "rpush" else rr.hset(name, "x", "1"))
    before = await snapshot(rr, service)
    await refused(read(rr, service), name, what)
    assert await snapshot(rr, service) == before


async def test_read_refuses_an_lbs_of_the_wrong_type(rr: aioredis.Redis, service: str) -> None:
    await rr.hset(input_stream(service), "lbs-input", "{}")
    await set_lease(rr, service)
    before = await snapshot(rr, service)
    await refused(
        read(rr, service), input_stream(service), "holds a hash, not the load-balancer stream"
    )
    assert await snapshot(rr, service) == before
    assert not await rr.exists(fence_key(service), consumers_key(service))


async def test_read_refuses_token_records_of_the_wrong_type(
    rr: aioredis.Redis, service: str
) -> None:
    await taken(rr, service, 2)
    tokens = tokens_key(service)
    await rr.set(tokens, "x")
    before = await snapshot(rr, service)
    with pytest.raises(
        ResponseError, match=f"LBSKEY {re.escape(tokens)} holds a string, not a consumer's tokens"
    ):
        await read(rr, service, tokens=tokens)
    assert await snapshot(rr, service) == before


async def test_a_lost_fence_is_seeded_from_the_clock_and_never_goes_back(
    rr: aioredis.Redis, service: str
) -> None:
    ids = await taken(rr, service, 3)
    await rr.delete(fence_key(service))  # what the take left: the re-read starts with none
    at_call = us(await rr.time())
    entries, tokens = await read(rr, service, count=3)
    assert len(tokens) == 3 and tokens[0] > at_call
    assert tokens == [tokens[0]] * 3  # one token per batch, shared by its entries
    assert await rr.get(fence_key(service)) == str(tokens[0]).encode()  # 16 digits, printed in full
    assert [e[0].decode() for e in entries] == ids
    # The counter is lost (eviction, restart without persistence).
    await rr.delete(fence_key(service))
    # The seed is the clock; wait (without sleeping) until the server's clock
    # is past the tokens handed out, which a real loss always is by far.
    while us(await rr.time()) <= tokens[-1]:
        pass
    _, again = await read(rr, service)
    assert len(again) == 3 and min(again) > max(tokens)


async def test_a_fence_that_went_back_moves_up_to_the_clock(
    rr: aioredis.Redis, service: str
) -> None:
    # A failover to a replica that missed the last tokens (asynchronous replication) leaves the
    # counter below tokens already handed out: the next take starts at the server time, above them.
    await taken(rr, service, 2)
    _, tokens = await read(rr, service)
    await rr.set(fence_key(service), str(tokens[0] - 1000))  # what the replica had
    while us(await rr.time()) <= tokens[-1]:
        pass
    _, again = await read(rr, service)
    assert len(again) == 2 and again[0] > max(tokens)


async def test_a_re_read_without_records_writes_one_counter_step(
    rr: aioredis.Redis, service: str
) -> None:
    ids = await taken(rr, service, 3)
    lease = lease_key(service, "c1")
    await rr.pexpire(lease, 5_000)
    before = await snapshot(rr, service)
    entries, tokens = await read(rr, service)
    assert [e[0].decode() for e in entries] == ids and tokens == [tokens[0]] * 3
    assert await pending_to(rr, service) == dict.fromkeys(ids, b"c1")
    # The counter is all it wrote: no lock, no deadline (the heartbeat's), the lease as it was.
    after = await snapshot(rr, service)
    del before[fence_key(service).encode()], after[fence_key(service).encode()]
    assert after == before
    assert await rr.get(lease) == NONCE.encode() and await rr.pttl(lease) <= 5_000


async def test_a_re_read_finds_the_tokens_its_lease_recorded(
    rr: aioredis.Redis, service: str
) -> None:
    ids = await taken(rr, service, 4)
    tokens = tokens_key(service)
    # The lost read's record (a range, by this lease), another process's under this id (ignored).
    await rr.hset(tokens, mapping={"1000": f"{NONCE}|{ids[0]}..{ids[1]}", "999": f"n0|{ids[2]}"})
    _, got = await read(rr, service, tokens=tokens)
    assert got[:2] == [1000, 1000] and got[2] == got[3] > 1000  # no record of ours: a new token
    assert await rr.hget(tokens, str(got[2])) == f"{NONCE}|{ids[2]} {ids[3]}".encode()
    # A second re-read finds both records (the list of ids one too): no new token.
    fence = await rr.get(fence_key(service))
    _, again = await read(rr, service, tokens=tokens)
    assert again == got and await rr.get(fence_key(service)) == fence


async def test_a_name_holder_of_another_type_is_reported_and_the_names_go_on(
    rr: aioredis.Redis, service: str
) -> None:
    """names-1.lua (the take's names when its MSETNX set none) reports a holder key of another type
    for that entry alone: nothing of its name is written, the others are taken."""
    await lbs_with(rr, service, 0)
    for n in "abc":
        await rr.xadd(
            input_stream(service), {"lbs-input": f'{{"DataStreamName":"{n}","Info":{{}}}}'}
        )
    entries, _ = await deliver(rr, service)
    ids = [e[0].decode() for e in entries]
    bad = name_holder(service, "b")
    await rr.rpush(bad, "garbage")
    pairs = [x for n, i in zip("abc", ids, strict=True) for x in (n, i)]
    held = await rr.eval(
        source("names-1"),
        1,
        input_stream(service),
        group_name(service),
        key_prefix(service),
        *pairs,
    )
    assert held == [b"", f"WRONGTYPE list {bad}".encode(), b""]
    # Nothing of its name written; it stays pending to c1, which hands it back.
    assert await rr.lrange(bad, 0, -1) == [b"garbage"]
    assert not await rr.exists(key_prefix(service) + "waiting:b", waiting_key(service))
    assert await pending_to(rr, service) == dict.fromkeys(ids, b"c1")
    assert await rr.get(name_holder(service, "a")) == ids[0].encode()
    assert await rr.get(name_holder(service, "c")) == ids[2].encode()


async def test_the_re_read_lists_our_pending_entries_without_counting_a_delivery(
    rr: aioredis.Redis, service: str
) -> None:
    await lbs_with(rr, service, 3)
    entries, tokens = await deliver(rr, service)
    ids = [e[0].decode() for e in entries]
    # A pending entry deleted: it comes back with no fields.
    await rr.xdel(input_stream(service), ids[1])
    again, fresh = await read(rr, service)
    assert [e[0].decode() for e in again] == ids
    assert again[1][1] is None and again[0][1] == [x for kv in entries[0][1].items() for x in kv]
    # Fresh tokens, all three held under the lease still ours.
    assert fresh == [fresh[0]] * 3 and fresh[0] > tokens[2]  # no record kept: a new token
    rows = await rr.xpending_range(input_stream(service), group_name(service), "-", "+", 10)
    # A second delivery would read as a death.
    assert [row["times_delivered"] for row in rows] == [1, 1, 1]


async def test_acl_denials_refuse_a_re_read_whole_but_not_a_reap(
    any_server: Any, rr: aioredis.Redis, service: str
) -> None:
    """A user the ACL denies a write of the re-read (HSET on its token records) is refused before
    anything is written; the same user's reap-3 needs no HSET: it lists every entry found for a
    re-queue."""
    user, password = f"lbs-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    await rr.execute_command(
        "ACL", "SETUSER", user, "reset", "on", f">{password}", "+@all", "-hset", "~*"
    )
    url = any_server.url.replace("redis://", f"redis://{user}:{password}@")
    try:
        async with aioredis.Redis.from_url(url) as denied:
            ids = await taken(rr, service, 2)
            tokens = tokens_key(service)
            before = await snapshot(rr, service)
            with pytest.raises(NoPermissionError) as info:  # NOPERM (redis-py drops the code)
                await read(denied, service, tokens=tokens)
            assert str(info.value) == (
                f"lbs read-3: this user may not run HSET on {tokens}; nothing was read"
            )
            assert await snapshot(rr, service) == before
            # c1 dies with them pending.
            await set_lease(rr, service, "absent")
            await rr.zadd(consumers_key(service), {"c1": 1})
            gone, _next, holders, _deadlines = await reap(denied, service)
            assert gone == [i.encode() for i in ids] and holders == [b"c1"] * 2
            assert await pending_to(rr, service) == dict.fromkeys(ids, b"c1")
    finally:
        await rr.execute_command("ACL", "DELUSER", user)


# -- done-n.lua ---------------------------------------------------------------


async def test_done_retry_flag_reports_what_a_lost_call_finished(
    any_server: Any, rr: aioredis.Redis, service: str, xackdel: str
) -> None:
    ids = await taken(rr, service, 3)
    assert await done(rr, service, ids[:2], xackdel) == [1, 1]
    assert await rr.xlen(input_stream(service)) == 1
    before = await snapshot(rr, service)
    assert await done(rr, service, ids[:2], xackdel, retry="1") == [4, 4]
    assert await done(rr, service, ids[:2], xackdel, retry="0") == [3, 3]
    assert await snapshot(rr, service) == before
    # An entry still pending to us under our lease is done, flag or not.
    assert await done(rr, service, ids[2:], xackdel, retry="1") == [1]
    assert await pending(rr, service) == 0 and await rr.xlen(input_stream(service)) == 0


@pytest.mark.parametrize(("state", "words"), LEASE_LOST)
async def test_done_under_a_lease_it_does_not_hold_writes_nothing(
    any_server: Any, rr: aioredis.Redis, service: str, xackdel: str, state: str, words: str
) -> None:
    """Recovery takes a consumer's entries once its lease is gone: a done under a lease that does not
    hold ARGV[6] finishes nothing (every entry lost, retry flag or not) and releases no name."""
    names = ["a", "b", "c"]
    ids = await named(rr, service, names)
    await set_lease(rr, service, state)
    before = await snapshot(rr, service)
    for retry in ("0", "1"):
        assert await done(rr, service, ids, xackdel, retry=retry, names=names) == [3, 3, 3]
    assert await snapshot(rr, service) == before
    assert await pending_to(rr, service) == dict.fromkeys(ids, b"c1")
    # Under the lease it holds, the same call finishes them and releases their names.
    await set_lease(rr, service)
    assert await done(rr, service, ids, xackdel, names=names) == [1, 1, 1]
    assert await rr.xlen(input_stream(service)) == 0
    assert not await rr.exists(*[name_holder(service, n) for n in names])


async def test_done_under_the_lease_it_was_read_under_is_the_whole_check(
    any_server: Any, rr: aioredis.Redis, service: str, xackdel: str
) -> None:
    """The lease alone says what is c1's: recovery moves an entry only once c1's lease is gone, and c1
    takes it again under a new value (so a done built before is refused, test_lease.py). An entry moved
    by hand while c1's lease lives is acked by c1's done all the same (no owner check per entry: the
    operator's tools move only what a dead lease left; beside a Go fleet done-n checks, test_go_fleet)."""
    ids = await taken(rr, service, 2)
    await rr.xclaim(input_stream(service), group_name(service), "c2", 0, [ids[0]])
    assert await done(rr, service, ids, xackdel) == [1, 1]
    assert await pending(rr, service) == 0


async def test_done_leaves_a_name_holder_of_another_type_and_finishes_the_entry(
    any_server: Any, rr: aioredis.Redis, service: str, xackdel: str
) -> None:
    ids = await named(rr, service, ["a", "b"])
    bad = name_holder(service, "a")
    await rr.delete(bad)
    await rr.hset(bad, "x", "1")
    assert await done(rr, service, ids, xackdel, names=["a", "b"]) == [1, 1]
    assert await rr.type(bad) == b"hash"  # left alone: the next registration of "a" takes it over
    assert not await rr.exists(name_holder(service, "b"))
    assert await pending(rr, service) == 0 and await rr.xlen(input_stream(service)) == 0


async def test_done_refuses_a_wrong_argument_count(rr: aioredis.Redis, service: str) -> None:
    (entry_id,) = await taken(rr, service, 1)
    lbs, group, lease = input_stream(service), group_name(service), lease_key(service, "c1")
    before = await snapshot(rr, service)
    calls: list[tuple[list[str], list[str]]] = [
        # The layout before the lease: KEYS the LBS and a lock key per entry; ARGV group, flags, key
        # prefix, "", the lock values, the ids, the name holder keys.
        (
            [lbs, f"lock:{hash_tag(service)}:{entry_id}"],
            [group, "0", "0", "", "", "1:c1", entry_id, ""],
        ),
        ([lbs], [group, "0", "0", "", "c1", NONCE, "0", entry_id, ""]),  # no lease key
        ([lbs, lease], [group, "0", "0", "", "c1", NONCE, "0", entry_id]),  # an id without its name
        ([lbs, lease], [group, "0", "0", "", "c1", NONCE, "1", entry_id, ""]),  # Go: no Go key
        ([lbs, lease], [group, "0", "0", "", "c1", NONCE]),  # too few
    ]
    for keys, args in calls:
        with pytest.raises(ResponseError, match=r"^lbs done-n: expected 2 keys"):
            await rr.eval(source("done-n"), len(keys), *keys, *args)
    assert await snapshot(rr, service) == before
    assert await pending_to(rr, service) == {entry_id: b"c1"}


# -- extend-n.lua -------------------------------------------------------------


async def test_extend_refreshes_the_lease_and_moves_the_deadline(
    rr: aioredis.Redis, service: str
) -> None:
    await lbs_with(rr, service, 0)
    lease = lease_key(service, "c1")
    await rr.pexpire(lease, 5_000)
    at_call = us(await rr.time()) // 1000
    assert await extend(rr, service) == []
    assert await rr.get(lease) == NONCE.encode() and await rr.pttl(lease) > 5_000
    # Added to the deadline index (holding something or not: one key per consumer), due a TTL from now.
    assert (await rr.zscore(consumers_key(service), "c1") or 0) >= at_call + TTL
    await rr.zadd(consumers_key(service), {"c1": 1})
    assert await extend(rr, service) == []
    assert (await rr.zscore(consumers_key(service), "c1") or 0) >= at_call + TTL  # moved


@pytest.mark.parametrize(("state", "words"), LEASE_LOST)
async def test_extend_under_a_lease_it_does_not_hold_answers_lease_and_writes_nothing(
    rr: aioredis.Redis, service: str, state: str, words: str
) -> None:
    """A lost lease is the one note of the reply, and nothing is written: not the lease (another
    process's, or nobody's: every entry read under it may already be someone else's), not the deadline,
    not a Go-style lock."""
    ids = await taken(rr, service, 2)
    await set_lease(rr, service, state, ttl=5_000)
    await rr.zadd(consumers_key(service), {"c1": 1})
    go_keys = [go_lock_key(f"{service}-s{k}", i) for k, i in enumerate(ids)]
    before = await snapshot(rr, service)
    assert await extend(rr, service) == [words.encode()]
    assert await extend(rr, service, go=(TTL, ids, go_keys)) == [words.encode()]
    assert await snapshot(rr, service) == before
    assert await rr.zscore(consumers_key(service), "c1") == 1
    if state == "another":
        assert await rr.pttl(lease_key(service, "c1")) <= 5_000
    assert not await rr.exists(*go_keys)


async def test_extend_reports_a_deadline_index_of_another_type_and_still_extends_the_lease(
    rr: aioredis.Redis, service: str
) -> None:
    await taken(rr, service, 2)
    await rr.set(consumers_key(service), "x")
    lease = lease_key(service, "c1")
    await rr.pexpire(lease, 5_000)
    assert await extend(rr, service) == [
        f"LBSKEY {consumers_key(service)} holds a string, not the consumer deadline index".encode()
    ]
    assert await rr.get(consumers_key(service)) == b"x"
    assert await rr.pttl(lease) > 5_000


@pytest.mark.parametrize(
    ("keys", "args", "error"),
    [
        (2, [TTL, "g", "c1", NONCE], "expected 3 keys and 4"),
        (3, [TTL, "g", "c1"], "expected 3 keys and 4"),
        (
            3,
            [TTL, "g", "c1", NONCE, TTL, "0-1"],
            "expected 3 keys and 4",
        ),  # an id without its Go key
        (3, [0, "g", "c1", NONCE], r"lease TTL \(ARGV\[1\]\)"),
        (3, ["abc", "g", "c1", NONCE], r"lease TTL \(ARGV\[1\]\)"),
        (3, ["1" * 16, "g", "c1", NONCE], r"lease TTL \(ARGV\[1\]\)"),
        (3, [TTL, "g", "c1", ""], r"the lease value \(ARGV\[4\]\) must not be empty"),
        (3, [TTL, "g", "c1", NONCE, "-5"], r"Go-style lock TTL \(ARGV\[5\]\)"),
    ],
)
async def test_extend_refuses_malformed_arguments(
    rr: aioredis.Redis, service: str, keys: int, args: list[Any], error: str
) -> None:
    await taken(rr, service, 1)
    await rr.pexpire(lease_key(service, "c1"), 5_000)
    before = await snapshot(rr, service)
    all_keys = [input_stream(service), consumers_key(service), lease_key(service, "c1")]
    with pytest.raises(ResponseError, match=f"^lbs extend-n: {error}"):
        await rr.eval(source("extend-n"), keys, *all_keys[:keys], *args)
    assert await snapshot(rr, service) == before
    assert await rr.pttl(lease_key(service, "c1")) <= 5_000


async def test_extend_beside_a_go_fleet_refreshes_only_the_entries_whose_go_lock_is_ours(
    rr: aioredis.Redis, service: str
) -> None:
    """Beside a Go fleet each held entry has a Go-style lock: one that is absent or ours is (re)set and
    its entry's idle time refreshed; one a Go consumer holds is reported (its negative position) and
    its entry left alone, whatever lies between."""
    ids = await taken(rr, service, 4)
    go_keys = [go_lock_key(f"{service}-s{k}", i) for k, i in enumerate(ids)]
    for k in (1, 2):  # two taken by a Go consumer
        await rr.set(go_keys[k], "go-consumer")
    await rr.set(go_keys[3], "c1")  # ours already
    await asyncio.sleep(0.05)  # every entry idle for a while
    assert await extend(rr, service, go=(30_000, ids, go_keys)) == [-2, -3]
    rows = await rr.xpending_range(input_stream(service), group_name(service), "-", "+", 10)
    idle = {p["message_id"].decode(): p["time_since_delivered"] for p in rows}
    assert max(idle[ids[k]] for k in (0, 3)) < min(idle[ids[k]] for k in (1, 2))
    assert [p["times_delivered"] for p in rows] == [1, 1, 1, 1]  # JUSTID: no delivery counted
    assert [await rr.get(k) for k in go_keys] == [b"c1", b"go-consumer", b"go-consumer", b"c1"]
    assert 0 < await rr.pttl(go_keys[0]) <= 30_000
    assert await pending_to(rr, service) == dict.fromkeys(ids, b"c1")


# -- requeue-6.lua ------------------------------------------------------------


async def test_requeue_answers_each_entry_of_a_call_alone(rr: aioredis.Redis, service: str) -> None:
    """One call, many entries: each has its own outcome (re-queued, trimmed, held by a live holder, not
    pending), an id named twice goes back once, and a call cut short is an error that touches nothing."""
    dead = await taken(rr, service, 3)  # c1's
    await rr.xadd(input_stream(service), {"lbs-input": '{"stream":"s3"}'})
    ((alive, _),), _ = await deliver(rr, service, "c2")
    alive = alive.decode()
    await set_lease(rr, service, "absent")
    await set_lease(rr, service, "ours", consumer="c2")
    await rr.xdel(input_stream(service), dead[1])  # trimmed while pending
    keys, options = requeue_keys(service), requeue_switches(service, "c3")

    def entry(entry_id: str) -> list[str | int]:
        return [entry_id, "lease gone", "1", "", 0]

    head = [options, "absent", "", "1", "0", "", 0, 0]
    before = await snapshot(rr, service)
    with pytest.raises(ResponseError, match="entry 2 is cut short"):
        await rr.eval(source("requeue-6"), 5, *keys, *head, *entry(dead[0]), dead[2], "x", "1", "")
    assert await snapshot(rr, service) == before
    order = [dead[0], dead[1], alive, dead[0], "1-1", dead[2]]
    replies = await rr.eval(
        source("requeue-6"), 5, *keys, *head, *(a for i in order for a in entry(i))
    )
    assert [r[:1] if r[0] in (1, -1) else r for r in replies] == [
        [1],
        [-1],
        [0, b"lock"],
        [0, b"acked"],
        [0, b"acked"],
        [1],
    ]
    assert await pending_to(rr, service) == {alive: b"c2"}
    copies = await rr.xrange(input_stream(service))
    assert [i.decode() for i, _ in copies] == [
        alive,
        replies[0][1].decode(),
        replies[5][1].decode(),
    ]
    assert [f[b"_original_id"].decode() for _, f in copies[1:]] == [dead[0], dead[2]]


async def test_requeue_with_a_dead_letter_key_of_another_type_touches_nothing(
    rr: aioredis.Redis, service: str
) -> None:
    (entry_id,) = await taken(rr, service, 1)
    await set_lease(rr, service, "absent")  # its holder is gone
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
    (entry_id,) = await taken(rr, service, 1)
    await set_lease(rr, service, "absent")
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
    await set_lease(rr, service, "absent")
    out = await requeue(rr, service, entry_id, max_retries="3")
    assert out[0] == 1
    ((_, fields),) = await rr.xrange(input_stream(service))
    assert fields[b"lbs-keyed"] == b"1" and fields[b"_retry_count"] == b"10"
    assert await rr.xlen(dead_letter_stream(service)) == 0


async def delivered_wide_entry(
    rr: aioredis.Redis, service: str, fields: dict[str, str]
) -> tuple[str, int]:
    """XADD one entry with ``fields`` into a fresh LBS and deliver it to c1 under its lease (as a read does):
    its id and token."""
    await lbs_with(rr, service, 0)
    entry_id = (await rr.xadd(input_stream(service), fields)).decode()  # type: ignore[arg-type]
    _, (token,) = await deliver(rr, service)
    return entry_id, token


async def test_requeue_an_entry_too_big_to_copy_dead_letters_and_keeps_it(
    rr: aioredis.Redis, service: str
) -> None:
    stream = input_stream(service)
    fields: dict[str, str] = {"lbs-input": '{"stream":"huge"}'}
    fields.update({f"f{i}": str(i) for i in range(9_999)})
    entry_id, _ = await delivered_wide_entry(rr, service, fields)
    out = await requeue(rr, service, entry_id, mode="owned", max_retries="5")
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
    ((kept_id, kept),) = await rr.xrange(stream)
    assert kept_id.decode() == entry_id and len(kept) == 10_000
    # The record stays: a late done-n (under our lease, not pending) does not delete it.
    assert await done(rr, service, [entry_id]) == [3]
    assert await rr.xlen(stream) == 1


async def test_requeue_an_entry_too_big_without_a_dead_letter_stream(
    rr: aioredis.Redis, service: str
) -> None:
    stream = input_stream(service)
    entry_id, _ = await delivered_wide_entry(rr, service, {f"f{i}": "v" for i in range(4_000)})
    await set_lease(rr, service, "absent")
    assert await requeue(rr, service, entry_id, dlq="0", reason="") == [3, b"", b"", 1]
    assert await pending(rr, service) == 0 and await rr.xlen(stream) == 1
    assert not await rr.exists(dead_letter_stream(service))


async def test_requeue_just_below_the_copy_bound_copies(rr: aioredis.Redis, service: str) -> None:
    stream = input_stream(service)
    entry_id, _ = await delivered_wide_entry(rr, service, {f"f{i}": "v" for i in range(3_494)})
    await set_lease(rr, service, "absent")
    # A death counted (delivered, its holder gone): 6,988 values + 12 (with _deaths) = 7,000.
    out = await requeue(rr, service, entry_id, force="1")
    assert out[0] == 2
    ((_, dl),) = await rr.xrange(dead_letter_stream(service))
    assert (
        len(dl) == 3_494 + 6 and dl[b"_reason"] == b"boom" and dl[b"_deaths"] == entry_id.encode()
    )
    assert await rr.xlen(stream) == 0


@pytest.mark.parametrize(
    ("mode", "state"),
    [
        # "owned" and "restart": pending to c1 and c1's lease holding our value, else someone else's.
        *[(m, s) for m in ("owned", "restart") for s in ("absent", "another", "list", "hash")],
        ("owned", "handed on"),  # our lease, but the entry is pending to c2 now
        ("restart", "handed on"),
        # "absent": the lease of the consumer it is pending to must not exist (another type: alive).
        *[("absent", s) for s in ("ours", "another", "list", "hash")],
    ],
)
async def test_requeue_refuses_when_the_holder_check_fails(
    rr: aioredis.Redis, service: str, mode: str, state: str
) -> None:
    (entry_id,) = await taken(rr, service, 1)
    if state == "handed on":
        await rr.xclaim(input_stream(service), group_name(service), "c2", 0, [entry_id])
    else:
        await set_lease(rr, service, state)
    before = await snapshot(rr, service)
    assert await requeue(rr, service, entry_id, mode=mode) == [0, b"lock"]
    assert await snapshot(rr, service) == before
    assert await pending(rr, service) == 1


async def test_requeue_adds_before_it_acks(rr: aioredis.Redis, service: str) -> None:
    (entry_id,) = await taken(rr, service, 1)
    code, new_id, lbs_input, retries = await requeue(rr, service, entry_id, mode="owned")
    assert code == 1 and retries == 1 and lbs_input == b'{"stream":"s0"}'
    ((got_id, got),) = await rr.xrange(input_stream(service))
    assert got_id == new_id
    assert got == {
        b"lbs-input": b'{"stream":"s0"}',
        b"_retry_count": b"1",
        b"_original_id": entry_id.encode(),
    }
    assert await pending(rr, service) == 0
    assert await rr.get(lease_key(service, "c1")) == NONCE.encode()  # the lease is the consumer's


async def test_requeue_of_an_entry_no_longer_pending(rr: aioredis.Redis, service: str) -> None:
    (entry_id,) = await taken(rr, service, 1)
    await rr.xack(input_stream(service), group_name(service), entry_id)
    before = await snapshot(rr, service)
    assert await requeue(rr, service, entry_id, mode="owned") == [0, b"acked"]
    assert await snapshot(rr, service) == before
    assert await rr.xlen(input_stream(service)) == 1  # not deleted


async def test_requeue_of_a_trimmed_entry(rr: aioredis.Redis, service: str) -> None:
    (entry_id,) = await taken(rr, service, 1)
    await rr.xdel(input_stream(service), entry_id)
    assert await requeue(rr, service, entry_id, mode="owned") == [-1, b"trimmed"]
    assert await pending(rr, service) == 0


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
    (entry_id,) = await taken(rr, service, 1)
    name = key(service)
    await (
        rr.rpush(name, "x")
        if setup == "rpush"
        else rr.hset(name, "x", "1")
        if setup == "hset"
        else rr.set(name, "x")
    )
    before = await snapshot(rr, service)
    code, message = await requeue(rr, service, entry_id, mode="owned", delay=(1000, 60_000, 1.0))
    assert code == -2 and message == f"LBSKEY {name} {what}".encode()
    assert await snapshot(rr, service) == before
    assert await pending(rr, service) == 1
    # At once (no delay), neither key is needed; past max retries neither is either.
    out = await requeue(
        rr, service, entry_id, mode="owned", max_retries="0", delay=(1000, 60_000, 1.0)
    )
    assert out[0] == 2 and await pending(rr, service) == 0


async def test_requeue_parks_the_copy_for_its_delay(rr: aioredis.Redis, service: str) -> None:
    (entry_id,) = await taken(rr, service, 1)
    # Retry count 1 after this call: d = min(400 * 2^0, 1000) = 400, jittered by 0.5: 200 ms.
    code, parked_id, lbs_input, retries, delay = await requeue(
        rr, service, entry_id, mode="owned", delay=(400, 1000, 0.5)
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
    await lbs_with(rr, service, 0)
    await rr.xadd(
        input_stream(service), {"lbs-input": '{"stream":"s"}', "_retry_count": str(retries)}
    )
    ((entry_id, _),), _ = await deliver(rr, service)
    out = await requeue(
        rr, service, entry_id.decode(), mode="any", max_retries="-1", delay=(first, most, jitter)
    )
    assert out[0] == 4 and out[3] == retries + 1 and out[4] == expected


async def test_promote_refuses_keys_of_the_wrong_type(rr: aioredis.Redis, service: str) -> None:
    (entry_id,) = await taken(rr, service, 1)
    parked_id = (await requeue(rr, service, entry_id, mode="owned", delay=(1, 1, 1.0)))[1]
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
    ids = await taken(rr, service, 3)
    parked = [
        (await requeue(rr, service, entry_id, mode="owned", delay=(ms, ms, 1.0)))[1]
        for entry_id, ms in zip(ids, (1, 1, 3_600_000))
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
        b"_original_id": ids[0].encode(),
    }
    assert [i for i, _ in await rr.xrange(delayed_stream(service))] == [parked[2]]
    assert await rr.zrange(due_key(service), 0, -1) == [parked[2]]
    assert (await promote(rr, service))[:2] == [0, 0]


async def test_promote_a_full_batch_asks_to_be_called_again(
    rr: aioredis.Redis, service: str
) -> None:
    for entry_id in await taken(rr, service, 3):
        await requeue(rr, service, entry_id, mode="owned", delay=(1, 1, 1.0))
    scores = sorted(s for _, s in await rr.zrange(due_key(service), 0, -1, withscores=True))
    await past(rr, scores[-1])
    # A batch that would end inside a due time leaves that due time's ids for the next call
    # (their order): the second and third parked in the same millisecond, the first alone.
    first = 1 if scores[0] != scores[1] == scores[2] else 2
    assert await promote(rr, service, batch=2) == [first, 0, 0, 0, 0]
    assert await promote(rr, service, batch=2) == [3 - first, 0, -1, 0, 0]
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


# -- reap-3.lua ---------------------------------------------------------------


async def dead(r: aioredis.Redis, service: str, n: int) -> list[str]:
    """``n`` entries c1 read under its lease, then c1 dead: its lease gone, its deadline passed."""
    ids = await taken(r, service, n)
    await set_lease(r, service, "absent")
    await r.zadd(consumers_key(service), {"c1": 1})
    return ids


async def test_reap_lists_a_dead_holders_entries_and_requeue_puts_them_back_under_new_ids(
    rr: aioredis.Redis, service: str
) -> None:
    """reap-3 takes nothing over: every entry of a holder whose lease is gone stays pending to it,
    listed in gone with its holder and the holder's deadline (for the journal), and no token is taken;
    requeue-6 (mode "absent") then writes each back as a fresh entry, its death counted."""
    ids = await dead(rr, service, 3)
    fence = await rr.get(fence_key(service))
    before = await snapshot(rr, service)
    gone, _next, holders, deadlines = await reap(rr, service)
    assert gone == [i.encode() for i in ids] and holders == [b"c1"] * 3
    assert deadlines == [b"c1", b"1"]
    # Nothing claimed, no token taken, c1 still due: only the reap's time written.
    after = await snapshot(rr, service)
    del after[reaped_key(service).encode()]
    before.pop(reaped_key(service).encode(), None)
    assert after == before
    assert await rr.get(fence_key(service)) == fence
    assert await pending_to(rr, service) == dict.fromkeys(ids, b"c1")
    copies = []
    for i in ids:
        code, new, _input, retries = await requeue(rr, service, i)
        assert (code, retries) == (1, 1)
        copies.append(new)
    assert not set(copies) & set(gone) and await pending(rr, service) == 0
    # c1 has nothing pending now: the next call drops it from the index.
    assert await reap(rr, service) == [[], -1, [], []]
    assert await rr.zscore(consumers_key(service), "c1") is None


@pytest.mark.parametrize("lease", ["alive", "without a ttl", "list"])
async def test_reap_takes_nothing_from_a_consumer_whose_lease_is_there(
    rr: aioredis.Redis, service: str, lease: str
) -> None:
    """A lease that lives keeps its consumer's entries; one without a TTL (set by hand) or of another
    type is not reap's to time: the consumer leaves the index, its entries are left to the scan."""
    ids = await dead(rr, service, 2)
    key = lease_key(service, "c1")
    if lease == "alive":
        await rr.set(key, "n0", px=TTL)
    elif lease == "without a ttl":
        await rr.set(key, "n0")
    else:
        await rr.rpush(key, "n0")
    at_call = us(await rr.time()) // 1000
    gone, *_ = await reap(rr, service)
    assert gone == []
    assert await pending_to(rr, service) == dict.fromkeys(ids, b"c1")
    score = await rr.zscore(consumers_key(service), "c1")
    if lease == "alive":
        assert score is not None and score > at_call  # due again when the lease can be gone
    else:
        assert score is None
    assert await rr.exists(key)


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
