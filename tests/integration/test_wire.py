"""Batches encoded by the core, over a redis-py connection, against a real server."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from lbs._wire import Wire

SCRIPT = "return {KEYS[1], ARGV[1]}"


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
async def rp(redis_server: Any, request: pytest.FixtureRequest) -> Any:
    c = aioredis.Redis.from_url(redis_server.url, protocol=request.param)
    try:
        yield c
    finally:
        await c.aclose()


async def test_each_command_gets_its_own_reply_and_errors_stay_per_command(rp: aioredis.Redis, service: str) -> None:
    wire = Wire(rp)
    try:
        replies = await wire.execute(lambda b: (b.command("SET", f"{service}:k", "v"),
                                                b.command("LPUSH", f"{service}:k", "x"),  # WRONGTYPE
                                                b.command("GET", f"{service}:k")))
        assert replies[0] == b"OK" or replies[0] == "OK"
        assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
        assert replies[2] == b"v"
        assert await wire.execute(lambda b: None) == []
    finally:
        await wire.close()
        await rp.delete(f"{service}:k")


async def test_noscript_loads_the_scripts_and_sends_the_batch_again(rp: aioredis.Redis, service: str) -> None:
    sha = (await rp.script_load(SCRIPT))
    sha = sha.decode() if isinstance(sha, bytes) else sha
    await rp.script_flush()
    wire = Wire(rp, [SCRIPT])
    try:
        (reply,) = await wire.execute(lambda b: b.evalsha_locks(sha, (), b"lock:", ["1-0"], (), None, True))
        assert reply == [b"lock:1-0", b"1-0"]
    finally:
        await wire.close()


async def test_a_dropped_connection_raises_and_the_next_batch_reconnects(rp: aioredis.Redis) -> None:
    wire = Wire(rp)
    try:
        (cid,) = await wire.execute(lambda b: b.command("CLIENT", "ID"))
        await rp.client_kill_filter(_id=cid)
        with pytest.raises(RedisConnectionError):
            await wire.execute(lambda b: b.command("PING"))
        assert await wire.execute(lambda b: b.command("PING")) in ([b"PONG"], ["PONG"])
    finally:
        await wire.close()
