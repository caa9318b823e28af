"""Dead-letter forwarding to a plugin's backend: delete only after the backend confirmed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from _helpers import client, eventually, is_true

import lbs
from lbs._keys import dead_letter_group


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
    return client(url, service, "c", plugins=[Provides(backend)], **{"read_retry_initial": 0.05, **config})


async def _bad_entry(r: aioredis.Redis, service: str) -> str:
    await r.xgroup_create(lbs.input_stream(service), lbs.group_name(service), id="0", mkstream=True)
    return str((await r.xadd(lbs.input_stream(service), {"lbs-input": "{not json"})).decode())


async def _empty(r: aioredis.Redis, key: str) -> bool:
    return await r.xlen(key) == 0 and await r.exists(key) == 1


async def test_a_dead_letter_is_forwarded_and_then_deleted(redis_server: Any, service: str,
                                                           r: aioredis.Redis) -> None:
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
    assert (await r.xpending(lbs.dead_letter_stream(service), dead_letter_group(service)))["pending"] == 0


async def test_a_failed_write_keeps_the_letters_until_a_write_succeeds(redis_server: Any, service: str,
                                                                      r: aioredis.Redis) -> None:
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
        redis_server: Any, service: str, r: aioredis.Redis) -> None:
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


async def test_without_a_backend_dead_letters_stay_in_the_stream(redis_server: Any, service: str,
                                                                r: aioredis.Redis) -> None:
    await _bad_entry(r, service)
    c = lbs.Client(redis_server.url, service, "c", lbs.Config(read_block=0.1), load_entrypoint_plugins=False)
    await c.start()
    try:
        await eventually(lambda: _len_is(r, lbs.dead_letter_stream(service), 1))
    finally:
        await c.close()
    groups = await r.xinfo_groups(lbs.dead_letter_stream(service))
    assert groups == []


async def _len_is(r: aioredis.Redis, key: str, n: int) -> bool:
    return bool(await r.xlen(key) == n)
