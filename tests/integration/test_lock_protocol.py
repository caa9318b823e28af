"""Upgrading from the per-entry lock protocol: a lease consumer never starts beside a live consumer of
the lock protocol, and once none lives it sets the tripwire that refuses the old protocol's calls.

The old consumers are played by their real footprint in Redis: a member of the old deadline index
``{<service>-input}:consumers`` (ZADD, as their heartbeat wrote it) and, while the process lives, its
marker ``{<service>-input}:instance:<id>`` (SET ... PX, as its start and heartbeat wrote it); their
calls by the commands with which the old read and heartbeat began (ZSCORE, ZADD of that key).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

import lbs
from lbs._consumer.protocol import TRIPWIRE
from lbs._keys import consumers_key, lock_protocol_index, lock_protocol_marker

from _helpers import client, produce, take

pytestmark = pytest.mark.timeout(60)


async def _old_consumer(r: aioredis.Redis, service: str, consumer: str, alive: bool) -> None:
    """What a lock-protocol consumer leaves in Redis: its deadline, and while it lives its marker."""
    await r.zadd(lock_protocol_index(service), {consumer: int(time.time() * 1000) + 10_000})
    if alive:
        await r.set(lock_protocol_marker(service, consumer), "0123456789ab", px=30_000)


@pytest.mark.usefixtures("redis_server")
async def test_a_lease_consumer_refuses_to_start_beside_a_live_lock_protocol_consumer(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await _old_consumer(r, service, "old-1", alive=True)
    await _old_consumer(r, service, "old-2", alive=False)
    await produce(redis_server.url, service, "a")
    c = client(redis_server.url, service, "new-1")
    try:
        with pytest.raises(lbs.ConfigurationError, match="old-1") as caught:
            await c.start()
        message = str(caught.value)
        assert "lock protocol" in message and "Recreate" in message and "old-2" not in message
    finally:
        await c.close()
    # Nothing was written: the old index is the old consumers' still, and nothing was read.
    assert await r.type(lock_protocol_index(service)) == b"zset"
    assert await r.zcard(lock_protocol_index(service)) == 2
    assert not await r.exists(consumers_key(service))
    assert (await r.xpending(lbs.input_stream(service), lbs.group_name(service)))["pending"] == 0


@pytest.mark.usefixtures("redis_server")
async def test_once_no_lock_protocol_consumer_lives_the_tripwire_refuses_the_old_calls(
    redis_server: Any, service: str, r: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await _old_consumer(r, service, "old-1", alive=False)  # stopped: its marker is gone
    await produce(redis_server.url, service, "a")
    c = client(redis_server.url, service, "new-1")
    try:
        with caplog.at_level(logging.WARNING, logger="lbs"):
            await c.start()
        (note,) = await take(c, 1)
        assert note.stream == "a"
        assert await r.get(lock_protocol_index(service)) == TRIPWIRE.encode()
        assert "none alive: replaced by the consumer lease's tripwire" in caplog.text
        # The lease protocol's deadline index lives under its own name.
        assert await r.zscore(consumers_key(service), c.id) is not None
        # The old read began with ZSCORE of its index, the old heartbeat ZADDed to it: both refused.
        old = lock_protocol_index(service)
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await r.zscore(old, "old-1")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await r.zadd(old, {"old-1": 1})
        await c.done_streams([note.stream])
    finally:
        await c.close()
    # A second start finds the tripwire and goes on.
    again = client(redis_server.url, service, "new-2")
    try:
        await again.start()
    finally:
        await again.close()
    assert await r.get(lock_protocol_index(service)) == TRIPWIRE.encode()


@pytest.mark.usefixtures("redis_server")
async def test_the_old_index_key_of_another_type_fails_the_start_with_its_name(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    await r.hset(lock_protocol_index(service), "x", "1")
    c = client(redis_server.url, service, "new-1")
    try:
        with pytest.raises(lbs.RedisOperationError, match="holds a hash"):
            await c.start()
    finally:
        await c.close()
    assert await r.type(lock_protocol_index(service)) == b"hash"
