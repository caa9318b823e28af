"""One holder per data stream name, whatever the registrations (``_names.lua``).

A data stream registered again while it is held waits: read, acked (it stays
in the LBS as its own record, pending to nobody, so held under no consumer's
lease) and parked in the name's waiting list, with no retry counted; the
holder's release (done, re-queue, dead letter) puts the oldest waiter back into
the LBS. The script tests (a read as the client's take makes it: MSETNX, else ``names-1.lua``)
run on Redis 8.x and 7.0 (``rr``); the client tests show two handlers of one name never run at
once, and every registration runs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._keys import (
    fence_key,
    group_name,
    input_stream,
    key_prefix,
    lease_key,
    name_holder,
    waiting_key,
    waiting_list,
)
from lbs._redis.scripts import done_codes, source

from _helpers import (
    client,
    command_calls,
    eventually,
    is_true,
    produce,
    requeue_keys,
    requeue_switches,
    take,
)

pytestmark = pytest.mark.timeout(90)

#: The lease value c1's calls are made under (its process's instance nonce).
NONCE = "n1"


def reg(name: str, n: int = 0) -> dict[str, str]:
    """A registration of data stream ``name`` (``n`` tells registrations of one name apart)."""
    return {
        "lbs-input": json.dumps({"DataStreamName": name, "Info": {"n": n}}, separators=(",", ":"))
    }


async def setup(r: aioredis.Redis, service: str, *regs: dict[str, str]) -> list[str]:
    """The group, c1's lease (holding ``NONCE``) and ``regs`` added to the LBS: their entry ids."""
    await r.xgroup_create(input_stream(service), group_name(service), id="0", mkstream=True)
    await r.set(lease_key(service, "c1"), NONCE)
    return [(await r.xadd(input_stream(service), f)).decode() for f in regs]


async def read(
    r: aioredis.Redis, service: str, consumer: str = "c1", count: int = 10
) -> tuple[list[str], list[Any]]:
    """What c1's Lua-free read does (lbs._consumer.take): XREADGROUP >, one token for the batch
    (fence-1.lua's floor, then INCRBY) and the names: at once with one MSETNX when the batch's names
    are distinct, else (or when it set none) one by one with names-1.lua. (entry ids, tokens): an
    int, or names-1.lua's "WAIT <holder id>" / "WRONGTYPE <type> <key>"."""
    reply = await r.xreadgroup(
        group_name(service), consumer, {input_stream(service): ">"}, count=count
    )
    entries = reply[0][1] if reply else []
    ids = [e[0].decode() for e in entries]
    if not ids:
        return [], []
    await r.eval(source("fence-1"), 1, fence_key(service))
    tokens: list[Any] = [await r.incrby(fence_key(service), 1)] * len(ids)
    names = [json.loads(f[b"lbs-input"])["DataStreamName"] for _, f in entries]
    if len(set(names)) == len(names) and await r.msetnx(
        {name_holder(service, n): i for n, i in zip(names, ids, strict=True)}
    ):
        return ids, tokens
    pairs = [x for n, i in zip(names, ids, strict=True) for x in (n, i)]
    held = await r.eval(
        source("names-1"),
        1,
        input_stream(service),
        group_name(service),
        key_prefix(service),
        *pairs,
    )
    return ids, [t if h == b"" else h.decode() for t, h in zip(tokens, held, strict=True)]


async def done(r: aioredis.Redis, service: str, held: list[tuple[str, int, str]]) -> list[int]:
    """One done-n.lua call over (entry id, token, name) held by c1 under its lease."""
    keys = [input_stream(service), lease_key(service, "c1")]
    args = [
        group_name(service),
        "0",
        "0",
        key_prefix(service),
        "c1",
        NONCE,
        "0",
        *(i for i, _, _ in held),
        *(name_holder(service, n) if n else "" for _, _, n in held),
    ]
    return done_codes(await r.eval(source("done-n"), len(keys), *keys, *args))


async def requeue(r: aioredis.Redis, service: str, entry_id: str) -> list[Any]:
    """One requeue-6.lua call: c1 hands ``entry_id`` back under its lease, a retry counted."""
    options = requeue_switches(service, "c1", key_prefix=key_prefix(service))
    args = [options, "owned", NONCE, "1", "0", "", 0, 0, entry_id, "boom", 1.0, "", 0]
    (reply,) = await r.eval(source("requeue-6"), 5, *requeue_keys(service), *args)
    return reply


async def promote(r: aioredis.Redis, service: str) -> list[int]:
    p = f"{{{input_stream(service)}}}:"
    return await r.eval(
        source("promote-4"),
        4,
        p + "due",
        p + "delayed",
        input_stream(service),
        waiting_key(service),
        100,
        group_name(service),
        key_prefix(service),
    )


async def fields_of(r: aioredis.Redis, service: str, entry_id: str) -> dict[str, str]:
    found = await r.xrange(input_stream(service), entry_id, entry_id)
    return decoded(found[0][1]) if found else {}


def decoded(fields: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in fields.items()}


async def pending_ids(r: aioredis.Redis, service: str) -> list[str]:
    rows = await r.xpending_range(input_stream(service), group_name(service), "-", "+", 100)
    return [row["message_id"].decode() for row in rows]


# -- the scripts ----------------------------------------------------------------


async def test_a_second_registration_waits_and_comes_back_when_the_holder_is_done(
    rr: aioredis.Redis, service: str
) -> None:
    a1, b1, a2, a3 = await setup(rr, service, reg("a", 1), reg("b"), reg("a", 2), reg("a", 3))
    ids, tokens = await read(rr, service)
    assert ids == [a1, b1, a2, a3]
    assert isinstance(tokens[0], int) and isinstance(tokens[1], int)
    assert tokens[2:] == [f"WAIT {a1}", f"WAIT {a1}"]
    # The waiters are acked (pending to nobody: held under no lease) ...
    assert await pending_ids(rr, service) == [a1, b1]
    assert await fields_of(rr, service, a2) == reg(
        "a", 2
    )  # ... and kept in the LBS as their record
    assert [i.decode() for i in await rr.lrange(waiting_list(service, "a"), 0, -1)] == [a2, a3]
    assert await rr.get(name_holder(service, "a")) == f"{a1}+".encode()
    assert await rr.get(name_holder(service, "b")) == b1.encode()

    assert await done(rr, service, [(a1, tokens[0], "a"), (b1, tokens[1], "b")]) == [1, 1]
    assert not await rr.exists(name_holder(service, "b"))
    # The oldest waiter is back as a fresh entry, its fields unchanged (no retry counted).
    ((back, fields),) = await rr.xrange(input_stream(service), f"({a3}", "+")
    assert decoded(fields) == reg("a", 2) and not await fields_of(rr, service, a2)
    assert await rr.get(name_holder(service, "a")) == f"+{back.decode()}".encode()
    ids, tokens = await read(rr, service)
    assert ids == [back.decode()] and isinstance(tokens[0], int)
    assert await rr.get(name_holder(service, "a")) == f"{back.decode()}+".encode()
    assert tokens[0] > 0

    # The last waiter: back once this one is done, then the name is free and nothing is left behind.
    assert await done(rr, service, [(back.decode(), tokens[0], "a")]) == [1]
    ids, tokens = await read(rr, service)
    assert len(ids) == 1 and await fields_of(rr, service, ids[0]) == reg("a", 3)
    assert await done(rr, service, [(ids[0], tokens[0], "a")]) == [1]
    assert not await rr.exists(
        name_holder(service, "a"), waiting_list(service, "a"), waiting_key(service)
    )
    assert await rr.xlen(input_stream(service)) == 0


async def msetnx_calls(r: aioredis.Redis) -> int:
    return (await command_calls(r)).get("msetnx", 0)


async def test_a_batch_of_free_names_takes_them_in_one_call_and_a_held_one_falls_back_per_entry(
    rr: aioredis.Redis, service: str
) -> None:
    await rr.config_resetstat()
    a1, b1, c1 = await setup(rr, service, reg("a"), reg("b"), reg("c"))
    ids, tokens = await read(rr, service)
    assert ids == [a1, b1, c1] and all(isinstance(t, int) for t in tokens)
    assert await msetnx_calls(rr) == 1  # every name at once
    assert await rr.mget([name_holder(service, n) for n in "abc"]) == [
        a1.encode(),
        b1.encode(),
        c1.encode(),
    ]
    # "a" is held: the one MSETNX sets nothing, and each entry is taken on its own.
    a2 = (await rr.xadd(input_stream(service), reg("a", 2))).decode()
    d1 = (await rr.xadd(input_stream(service), reg("d"))).decode()
    ids, tokens = await read(rr, service)
    assert ids == [a2, d1] and tokens[0] == f"WAIT {a1}" and isinstance(tokens[1], int)
    assert await msetnx_calls(rr) == 2
    assert await rr.get(name_holder(service, "a")) == f"{a1}+".encode()
    assert await rr.get(name_holder(service, "d")) == d1.encode()


async def test_tokens_of_one_name_grow_across_its_holds(rr: aioredis.Redis, service: str) -> None:
    await setup(rr, service, *(reg("a", i) for i in range(5)))
    tokens = []
    for _ in range(5):
        ids, got = await read(rr, service)
        held = [(i, t) for i, t in zip(ids, got) if isinstance(t, int)]
        assert len(held) == 1
        tokens.append(held[0][1])
        await done(rr, service, [(held[0][0], held[0][1], "a")])
    assert tokens == sorted(set(tokens))


async def test_a_name_whose_holder_is_no_longer_pending_is_taken_over(
    rr: aioredis.Redis, service: str
) -> None:
    a1, _a2 = await setup(rr, service, reg("a", 1), reg("a", 2))
    await rr.set(
        name_holder(service, "a"), "1-1+"
    )  # a holder gone without releasing it; waiters marked
    ids, tokens = await read(rr, service, count=1)
    assert ids == [a1] and isinstance(tokens[0], int)
    assert await rr.get(name_holder(service, "a")) == f"{a1}+".encode()  # the mark is kept
    ids, tokens = await read(rr, service)
    assert tokens == [f"WAIT {a1}"]


async def test_requeue_releases_the_name_and_puts_the_waiter_back_after_the_copy(
    rr: aioredis.Redis, service: str
) -> None:
    a1, a2 = await setup(rr, service, reg("a", 1), reg("a", 2))
    await read(rr, service)
    out = await requeue(rr, service, a1)
    assert out[0] == 1
    (copy, cf), (_waiter, wf) = await rr.xrange(input_stream(service), f"({a2}", "+")
    assert copy.decode() == out[1].decode() and cf[b"_retry_count"] == b"1"
    assert decoded(wf) == reg("a", 2)  # the waiter has no retry counted
    assert await rr.get(name_holder(service, "a")) is None
    _ids, tokens = await read(rr, service)
    assert tokens[0] > 0 and tokens[1] == f"WAIT {copy.decode()}"


async def test_the_sweep_puts_back_waiters_of_a_holder_that_vanished(
    rr: aioredis.Redis, service: str
) -> None:
    a1, a2 = await setup(rr, service, reg("a", 1), reg("a", 2))
    await read(rr, service)
    score = await rr.zscore(waiting_key(service), "a")
    await rr.zadd(waiting_key(service), {"a": 0})  # due now
    assert (await promote(rr, service))[4] == 0  # a1 is pending: still held, looked at again later
    assert await rr.zscore(waiting_key(service), "a") >= score
    # The holder vanishes without releasing the name (deleted by hand while pending).
    await rr.xack(input_stream(service), group_name(service), a1)
    await rr.xdel(input_stream(service), a1)
    await rr.zadd(waiting_key(service), {"a": 0})
    assert (await promote(rr, service))[4] == 1
    ((_back, fields),) = await rr.xrange(input_stream(service), f"({a2}", "+")
    assert decoded(fields) == reg("a", 2)
    assert not await rr.exists(name_holder(service, "a"), waiting_key(service))


async def test_name_keys_of_another_type_touch_nothing_of_the_name(
    rr: aioredis.Redis, service: str
) -> None:
    (a1,) = await setup(rr, service, reg("a", 1))
    await rr.hset(name_holder(service, "a"), "x", "1")
    _ids, tokens = await read(rr, service)
    assert tokens == [f"WRONGTYPE hash {name_holder(service, 'a')}"]
    # Left pending to c1 (held under its lease), which hands it back; no waiter recorded.
    assert await pending_ids(rr, service) == [a1]
    assert not await rr.exists(waiting_list(service, "a"))

    # The waiting index is looked at only once an entry must wait: of another type, the
    # registration that would wait is left pending as above; one whose name is free is read.
    await rr.delete(name_holder(service, "a"))
    await rr.set(waiting_key(service), "x")
    b1 = (await rr.xadd(input_stream(service), reg("b", 1))).decode()
    b2 = (await rr.xadd(input_stream(service), reg("b", 2))).decode()
    ids, tokens = await read(rr, service)
    assert ids == [b1, b2]
    assert isinstance(tokens[0], int) and tokens[1] == f"WRONGTYPE string {waiting_key(service)}"
    assert await rr.get(name_holder(service, "b")) == b1.encode()  # no waiter recorded
    assert not await rr.exists(waiting_list(service, "b"))
    assert await pending_ids(rr, service) == [a1, b1, b2]


async def test_a_waiting_list_of_another_type_leaves_the_second_registration_pending(
    rr: aioredis.Redis, service: str
) -> None:
    a1, a2 = await setup(rr, service, reg("a", 1), reg("a", 2))
    await rr.hset(waiting_list(service, "a"), "x", "1")
    _ids, tokens = await read(rr, service)
    assert (
        isinstance(tokens[0], int) and tokens[1] == f"WRONGTYPE hash {waiting_list(service, 'a')}"
    )
    assert await pending_ids(rr, service) == [a1, a2]  # a2 stays pending to c1, which hands it back
    assert await rr.get(name_holder(service, "a")) == a1.encode()  # no waiter recorded
    assert await rr.hgetall(waiting_list(service, "a")) == {b"x": b"1"}  # left alone


# -- clients -----------------------------------------------------------------------


class Audit:
    """Handlers of one name that run at the same time, and every registration run."""

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self.running: dict[str, int] = {}
        self.overlaps: list[str] = []
        self.runs: list[tuple[str, int]] = []
        self.tokens: dict[str, list[int]] = {}

    async def handler(self, note: lbs.Notification) -> None:
        name = note.stream
        self.running[name] = self.running.get(name, 0) + 1
        if self.running[name] > 1:
            self.overlaps.append(name)
        self.tokens.setdefault(name, []).append(note.token)
        try:
            await asyncio.sleep(self.hold)
        finally:
            self.running[name] -= 1
        self.runs.append((name, note.info["n"]))


async def test_two_consumers_never_run_one_name_at_once(redis_server: Any, service: str) -> None:
    """Registered again and again (a retry after an uncertain add, two producers), each name runs one
    registration at a time, every registration runs once, and its tokens grow."""
    names = [f"dup-{i}" for i in range(5)]
    async with lbs.Producer(redis_server.url, service) as p:
        await p.add_streams([(n, {"n": k}) for k in range(4) for n in names])
    audit = Audit(0.05)
    clients = [client(redis_server.url, service, f"c{i}", lock_ttl=10) for i in range(2)]
    tasks = []
    for c in clients:
        await c.start()
        tasks.append(asyncio.create_task(c.run(audit.handler, handle_signals=False)))
    try:
        await eventually(lambda: is_true(len(audit.runs) == 20), timeout=30)
    finally:
        for c in clients:
            await c.close()
        await asyncio.gather(*tasks)
    assert audit.overlaps == []
    assert sorted(audit.runs) == sorted((n, k) for n in names for k in range(4))
    assert all(t == sorted(set(t)) for t in audit.tokens.values())
    assert sum(int(c.metrics.get("streams_waiting_total", 0)) for c in clients) >= 15


async def test_the_notification_api_gets_a_second_registration_only_after_done(
    redis_server: Any, service: str
) -> None:
    await produce(redis_server.url, service, "solo", "solo")
    async with client(redis_server.url, service) as c:
        (first,) = await take(c, 1)
        # The second registration is read (and parked), not delivered.
        await eventually(lambda: is_true(c.metrics.get("streams_waiting_total") == 1))
        assert c.drain_notifications() == []
        assert c.held == 1
        await c.done_stream(first.stream, first.entry_id)
        (second,) = await take(c, 1)
        assert (
            second.stream == "solo"
            and second.entry_id != first.entry_id
            and second.retry_count == 0
        )


async def test_waiting_registrations_are_not_reported_as_skipped_by_the_group(
    redis_server: Any, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Waiters are acked and kept in the LBS, below the group's last-delivered id: a consumer starting
    then must not count them as entries no consumer will ever read (the Go client's ``$`` group)."""
    await produce(redis_server.url, service, "solo", "solo", "solo")
    async with client(redis_server.url, service) as c:
        await take(c, 1)
        await eventually(lambda: is_true(c.metrics.get("streams_waiting_total") == 2))
        async with client(redis_server.url, service, "c2"):
            pass
    assert not [r for r in caplog.records if "no consumer will ever read them" in r.getMessage()]
