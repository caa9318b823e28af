"""Dead-letter forwarding to a plugin's backend: delete only after the backend confirmed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

import lbs
from lbs._keys import dead_letter_group

from _helpers import client, eventually, is_true


class Collect:
    """A backend that keeps what it was given; fails its first ``fail`` writes."""

    name = "collect"

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.attempts = 0
        self.written: list[lbs.DeadLetter] = []

    async def write(self, letters: Sequence[lbs.DeadLetter]) -> None:
        self.attempts += 1
        if self.attempts <= self.fail:
            raise OSError("disk full")
        self.written.extend(letters)


class Provides:
    def __init__(self, backend: Collect) -> None:
        self.backend = backend

    @lbs.hookimpl
    def lbs_dead_letter_backend(self) -> Collect:
        return self.backend


def forwarding(url: str, service: str, backend: Collect, **config: Any) -> lbs.Client:
    return client(
        url, service, "c", plugins=[Provides(backend)], **{"read_retry_initial": 0.05, **config}
    )


async def _bad_entry(r: aioredis.Redis, service: str) -> str:
    await r.xgroup_create(lbs.input_stream(service), lbs.group_name(service), id="0", mkstream=True)
    return str((await r.xadd(lbs.input_stream(service), {"lbs-input": "{not json"})).decode())


async def _empty(r: aioredis.Redis, key: str) -> bool:
    return await r.xlen(key) == 0 and await r.exists(key) == 1


async def test_a_dead_letter_is_forwarded_and_then_deleted(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    bad_id = await _bad_entry(r, service)
    backend = Collect()
    c = forwarding(redis_server.url, service, backend)
    await c.start()
    try:
        await eventually(lambda: _empty(r, lbs.dead_letter_stream(service)))
    finally:
        await c.close()
    (letter,) = backend.written
    assert letter.failed_id == bad_id and letter.lbs_input == "{not json"
    assert letter.reason and letter.consumer == c.id
    assert letter.to_dict()["failed_id"] == bad_id
    assert (await r.xpending(lbs.dead_letter_stream(service), dead_letter_group(service)))[
        "pending"
    ] == 0


async def test_a_failed_write_keeps_the_letters_until_a_write_succeeds(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await _bad_entry(r, service)
    backend = Collect(fail=2)
    c = forwarding(redis_server.url, service, backend, read_retry_initial=0.2)
    await c.start()
    try:
        await eventually(lambda: is_true(backend.attempts >= 1))
        assert await r.xlen(lbs.dead_letter_stream(service)) == 1  # not confirmed: still there
        await eventually(lambda: _empty(r, lbs.dead_letter_stream(service)))
    finally:
        await c.close()
    assert backend.attempts == 3 and len(backend.written) == 1
    assert c.metrics["dead_letters_forward_failures_total"] == 2
    assert c.metrics["dead_letters_forwarded_total"] == 1


async def test_letters_a_stopped_forwarder_left_unconfirmed_are_taken_over(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    dlq, group = lbs.dead_letter_stream(service), dead_letter_group(service)
    await r.xgroup_create(dlq, group, id="0", mkstream=True)
    letter_id = (await r.xadd(dlq, {"_reason": "poison", "_failed_id": "1-0"})).decode()
    assert await r.xreadgroup(group, "redis-consumer-gone", {dlq: ">"})  # read, never confirmed
    backend = Collect()
    c = forwarding(redis_server.url, service, backend, dead_letter_claim_idle=0.2)
    await c.start()
    try:
        await eventually(lambda: _empty(r, dlq))
    finally:
        await c.close()
    assert [(x.id, x.reason) for x in backend.written] == [(letter_id, "poison")]


async def test_without_a_backend_dead_letters_stay_in_the_stream(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await _bad_entry(r, service)
    c = lbs.Client(
        redis_server.url, service, "c", lbs.Config(read_block=0.1), load_entrypoint_plugins=False
    )
    await c.start()
    try:
        await eventually(lambda: _len_is(r, lbs.dead_letter_stream(service), 1))
    finally:
        await c.close()
    groups = await r.xinfo_groups(lbs.dead_letter_stream(service))
    assert groups == []


async def _len_is(r: aioredis.Redis, key: str, n: int) -> bool:
    return bool(await r.xlen(key) == n)


# -- DeadLetters: the operator's side (lbs dlq) ------------------------------------

import asyncio  # noqa: E402

import pytest  # noqa: E402

from lbs.deadletters import DeadLetters  # noqa: E402

_INPUT = '{"DataStreamName":"%s","Info":{}}'


async def _letters(r: aioredis.Redis, service: str, n: int, reason: str = "poison") -> list[str]:
    """``n`` letters as requeue-6.lua writes them, one round trip."""
    pipe = r.pipeline(transaction=False)
    for k in range(n):
        pipe.xadd(
            lbs.dead_letter_stream(service),
            {
                "lbs-input": _INPUT % f"s{k}",
                "_retry_count": "4",
                "_original_id": f"1-{k}",
                "_reason": f"{reason} {k % 2}",
                "_consumer": "c",
                "_failed_id": f"2-{k}",
            },
        )
    return [i.decode() for i in await pipe.execute()]


async def test_concurrent_replays_move_every_letter_exactly_once(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    first = await _letters(r, service, 300)

    async def more() -> list[str]:  # new letters keep arriving meanwhile: every EXEC may be aborted
        out = []
        for _ in range(30):
            out += await _letters(r, service, 1)
            await asyncio.sleep(0.002)
        return out

    async with (
        DeadLetters(redis_server.url, service) as a,
        DeadLetters(redis_server.url, service) as b,
    ):
        ra, rb, added = await asyncio.gather(a.replay(all=True), b.replay(all=True), more())
    replayed = [x.letter_id for x in ra + rb if x.outcome == "replayed"]
    assert len(replayed) == len(set(replayed))  # never twice
    assert set(first) <= set(replayed)
    left = [i.decode() for i, _ in await r.xrange(lbs.dead_letter_stream(service))]
    assert sorted(replayed + left) == sorted(first + added)  # nothing lost
    sources = [f[b"_replayed_from"].decode() for _, f in await r.xrange(lbs.input_stream(service))]
    assert sorted(sources) == sorted(replayed)


async def test_a_replay_copies_the_values_byte_for_byte(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    letter = (
        await r.xadd(
            lbs.dead_letter_stream(service),
            {
                "lbs-input": _INPUT % "x",
                "extra": b"\xff\x00raw",
                "_reason": "boom",
                "_failed_id": "5-1",
            },
        )
    ).decode()
    async with DeadLetters(redis_server.url, service) as dlq:
        (done,) = await dlq.replay([letter])
    assert (done.outcome, done.stream) == ("replayed", "x")
    ((entry_id, fields),) = await r.xrange(lbs.input_stream(service))
    assert entry_id.decode() == done.entry_id
    # Without an _original_id the failed entry's id is the original one.
    assert fields == {
        b"lbs-input": (_INPUT % "x").encode(),
        b"extra": b"\xff\x00raw",
        b"_retry_count": b"0",
        b"_original_id": b"5-1",
        b"_replayed_from": letter.encode(),
        b"_last_reason": b"boom",
        b"_replay_count": b"1",
    }


async def test_a_replay_uses_the_configured_prefix(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await r.xadd(
        lbs.dead_letter_stream(service),
        {"lbs-input": _INPUT % "x", "~reason": "r", "~failed_id": "7-0"},
    )
    async with DeadLetters(redis_server.url, service, config=lbs.Config(field_prefix="~")) as dlq:
        assert [x.reason for x in await dlq.list()] == ["r"]
        (_done,) = await dlq.replay(reason="R")
    ((_, fields),) = await r.xrange(lbs.input_stream(service))
    assert set(fields) == {
        b"lbs-input",
        b"~retry_count",
        b"~original_id",
        b"~replayed_from",
        b"~last_reason",
        b"~replay_count",
    }


async def test_a_replay_confirms_the_letter_to_the_forwarders(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    dlq_key, group = lbs.dead_letter_stream(service), dead_letter_group(service)
    (letter,) = await _letters(r, service, 1)
    await r.xgroup_create(dlq_key, group, id="0")
    assert await r.xreadgroup(
        group, "redis-consumer-f", {dlq_key: ">"}
    )  # being forwarded, unconfirmed
    async with DeadLetters(redis_server.url, service) as dlq:
        assert [x.outcome for x in await dlq.replay([letter])] == ["replayed"]
        assert await dlq.purge(all=True) == 0
    assert (await r.xpending(dlq_key, group))["pending"] == 0


async def test_list_pages_through_a_filter_newest_first(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    ids = await _letters(r, service, 450)
    async with DeadLetters(redis_server.url, service) as dlq:
        got = await dlq.list(1000, reason="POISON 1")
        assert [x.id for x in got] == ids[1::2][::-1]
        assert [x.id for x in await dlq.list(3)] == ids[-3:][::-1]
        assert await dlq.list(0) == []
        assert (await dlq.get(ids[7])) is not None and (await dlq.get("1-0")) is None
        assert await dlq.count() == 450


async def test_purge_leaves_what_came_after_the_count(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    ids = await _letters(r, service, 5)
    async with DeadLetters(redis_server.url, service) as dlq:
        assert await dlq.matching(reason="poison 0") == (3, ids[4])
        assert await dlq.matching(ids=[ids[1], "1-0"]) == (1, ids[1])
        later = await _letters(r, service, 2)
        assert await dlq.purge(reason="poison 0", until=ids[4]) == 3
        assert await dlq.purge(all=True, until=ids[4]) == 2
    assert [i.decode() for i, _ in await r.xrange(lbs.dead_letter_stream(service))] == later


async def test_dead_letters_refuse_what_cannot_work(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    with pytest.raises(lbs.ConfigurationError, match="dropped"):
        DeadLetters(redis_server.url, service, config=lbs.Config(dead_letter_stream=""))
    async with DeadLetters(redis_server.url, service) as dlq:
        for call in (
            dlq.replay(),
            dlq.purge(),
            dlq.replay(["1-0"], all=True),
            dlq.get("abc"),
            dlq.purge(["1-0", "x"]),
            dlq.list(-1),
            dlq.list(reason=""),
        ):
            with pytest.raises(lbs.ConfigurationError):
                await call
        await r.set(lbs.input_stream(service), "x")
        await _letters(r, service, 1)
        with pytest.raises(
            lbs.RedisOperationError, match=f"LBSKEY {lbs.input_stream(service)} holds a string"
        ):
            await dlq.replay(all=True)
        assert await dlq.count() == 1  # nothing moved; reading and purging do not need the LBS
        await r.delete(lbs.dead_letter_stream(service))
        await r.hset(lbs.dead_letter_stream(service), "a", "b")
        with pytest.raises(
            lbs.RedisOperationError, match="holds a hash, not the dead-letter stream"
        ):
            await dlq.list()
