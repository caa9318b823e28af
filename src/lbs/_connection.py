"""Turning the ``redis`` argument of the public API into a client."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any, Union

import redis.asyncio as aioredis

from .exceptions import ConfigurationError

#: What the public API accepts as ``redis``: a redis.asyncio client, or a URL.
RedisLike = Union["aioredis.Redis", str]


def resolve_client(redis: RedisLike) -> tuple[aioredis.Redis, bool]:
    """Return ``(client, owned)``; ``owned`` clients are closed by lbs."""
    if isinstance(redis, str):
        return aioredis.Redis.from_url(redis), True
    if isinstance(redis, aioredis.Redis):
        return redis, False
    raise ConfigurationError(
        f"redis must be a redis.asyncio.Redis client or a URL string, got {type(redis).__name__}"
    )


async def execute(pipe: Any) -> list[Any]:
    """Run a pipeline and always reset it, so a failed one leaves no connection behind."""
    try:
        return await pipe.execute()  # type: ignore[no-any-return]
    finally:
        await pipe.reset()


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel tasks and wait until they have ended.

    A cancellation that lands inside redis-py can be swallowed there (the
    connection handles it and returns), leaving a loop running; so cancel
    again until each task is really done.
    """
    pending = {t for t in tasks if t is not None and not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)
