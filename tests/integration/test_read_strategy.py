"""The reader strategy hook: XREADGROUP ... CLAIM (Redis >= 8.4), and refusals."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs

from _helpers import client, eventually, produce, take

IDLE = 0.2  # the claim threshold in these tests; waits past it are what the tests are about

#: The reader no longer does XREADGROUP ... CLAIM under the consumer lease (issue 44, stage 1).
claim_reads = pytest.mark.skip(reason="issue 44: CLAIM reads are being redesigned for the lease")


class ClaimIdle:
    @lbs.hookimpl
    def lbs_reader(self) -> lbs.ReadStrategy:
        return lbs.ReadStrategy(name="claim", claim_min_idle=IDLE)


def claiming(url: str, service: str, **config: Any) -> lbs.Client:
    return client(url, service, "claimer", plugins=[ClaimIdle()], recovery=False, **config)


async def _orphan(r: aioredis.Redis, service: str, name: str, holder: str) -> str:
    """Register ``name`` and deliver it to ``holder``, which then takes no lock and never returns."""
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    try:
        await r.xgroup_create(stream, group, id="0", mkstream=True)
    except Exception:
        pass  # BUSYGROUP
    await produce_one(r, service, name)
    reply = await r.xreadgroup(group, holder, {stream: ">"}, count=1)
    assert reply
    pending = await r.xpending_range(stream, group, "-", "+", 100, consumername=holder)
    return str(pending[-1]["message_id"].decode())


async def produce_one(r: aioredis.Redis, service: str, name: str) -> None:
    await lbs.Producer(r, service).add_stream(name)


@claim_reads
async def test_idle_dead_work_comes_back_in_the_same_read_as_new_work(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    entry_id = await _orphan(r, service, "dead", "redis-consumer-gone")
    await asyncio.sleep(IDLE + 0.1)  # idle past the threshold
    await produce_one(r, service, "new")
    c = claiming(redis_server.url, service)
    await c.start()
    try:
        notes = {n.stream: n for n in await take(c, 2)}
        assert set(notes) == {"dead", "new"}
        assert c.read_strategy.name == "claim"
        dead = notes["dead"]
        assert dead.entry_id == entry_id  # claimed, not re-queued as a fresh entry
        assert dead.retry_count == 1  # one earlier delivery, which failed
        assert notes["new"].retry_count == 0
        (p,) = await r.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), entry_id, entry_id, 1
        )
        assert p["consumer"].decode() == c.id
        assert (
            await r.get(lbs.lock_key(service, entry_id)) == f"{dead.token}:{c.lock_owner}".encode()
        )
        assert await c.done_stream("dead") is lbs.DoneStatus.DONE
    finally:
        await c.close()


@claim_reads
async def test_a_claimed_entry_whose_lock_is_held_stays_with_its_holder(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # A live holder that keeps its lock but not the entry's idle time (a Go client).
    entry_id = await _orphan(r, service, "slow", "redis-consumer-go")
    lock = lbs.lock_key(service, entry_id)
    await r.set(lock, "7:redis-consumer-go", px=60_000)
    await asyncio.sleep(IDLE + 0.1)
    await produce_one(r, service, "new")
    c = claiming(redis_server.url, service)
    await c.start()
    try:
        (note,) = await take(c, 1)
        assert note.stream == "new"
        await eventually(
            lambda: _pending_to(r, service, entry_id, c.id)
        )  # CLAIM moved it; we did not take it
        assert await r.get(lock) == b"7:redis-consumer-go"
        assert entry_id not in {h.entry_id for h in c.held_streams()}
    finally:
        await c.close()
    assert await r.get(lock) == b"7:redis-consumer-go"  # close() handed back only what it held


async def _pending_to(r: aioredis.Redis, service: str, entry_id: str, consumer: str) -> bool:
    p = await r.xpending_range(
        lbs.input_stream(service), lbs.group_name(service), entry_id, entry_id, 1
    )
    return bool(p) and p[0]["consumer"].decode() == consumer


@claim_reads
async def test_deliveries_count_towards_max_retries(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    entry_id = await _orphan(r, service, "poison", "redis-consumer-first")
    await r.xclaim(
        stream, group, "redis-consumer-second", 0, [entry_id]
    )  # a second delivery, also lost
    await asyncio.sleep(IDLE + 0.1)
    dead_letters: list[str] = []

    class Watch:
        @lbs.hookimpl
        def lbs_stream_dead_lettered(self, reason: str) -> None:
            dead_letters.append(reason)

    c = lbs.Client(
        redis_server.url,
        service,
        "claimer",
        lbs.Config(read_block=0.1, recovery=False, max_retries=1),
        plugins=[ClaimIdle(), Watch()],
        load_entrypoint_plugins=False,
    )
    await c.start()
    try:
        await eventually(lambda: _exists(r, lbs.dead_letter_stream(service)))
    finally:
        await c.close()
    ((_, fields),) = await r.xrange(lbs.dead_letter_stream(service))
    assert fields[b"_failed_id"] == entry_id.encode()
    assert b"2 deliveries" in fields[b"_reason"]
    assert dead_letters and "2 deliveries" in dead_letters[0]
    assert (await r.xpending(stream, group))["pending"] == 0
    assert not await r.exists(lbs.lock_key(service, entry_id))
    assert c.stats.taken == 0


async def _exists(r: aioredis.Redis, key: str) -> bool:
    return bool(await r.exists(key))


async def test_a_reader_plugin_can_refuse_the_server(redis_server: Any, service: str) -> None:
    class Picky:
        @lbs.hookimpl
        def lbs_reader(self, server_version: tuple[int, ...]) -> lbs.ReadStrategy:
            raise lbs.ConfigurationError(
                f"needs Redis 99, this is {'.'.join(map(str, server_version))}"
            )

    c = lbs.Client(
        redis_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1),
        plugins=[Picky()],
        load_entrypoint_plugins=False,
    )
    with pytest.raises(lbs.ConfigurationError, match=r"needs Redis 99, this is 8\."):
        await c.start()
    await c.close()


async def test_the_default_reader_is_a_plugin_that_can_be_replaced(
    redis_server: Any, service: str
) -> None:
    c = lbs.Client(
        redis_server.url, service, "c", lbs.Config(read_block=0.1), load_entrypoint_plugins=False
    )
    assert c.pm.get_plugin("lbs-default-reader") is not None
    await produce(redis_server.url, service, "s")
    await c.start()
    try:
        assert c.read_strategy == lbs.ReadStrategy(name="default")
        (note,) = await take(c, 1)
        assert note.stream == "s"
    finally:
        await c.close()


def test_read_strategy_rejects_a_bad_threshold() -> None:
    with pytest.raises(lbs.ConfigurationError, match="claim_min_idle"):
        lbs.ReadStrategy(name="x", claim_min_idle=0)
