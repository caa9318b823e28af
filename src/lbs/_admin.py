"""The operator's client: a plain client of the Redis that holds a key (on a cluster, its slot's master).

``lbs status``, :class:`lbs.DeadLetters` and ``lbs claim`` read and write one service's keys, all under
its hash tag: on Redis Cluster they talk to the master owning that slot through a plain client built
from the node's own settings (:func:`lbs._redis.connection.slot_owner`), so pipelines and MULTI/EXEC
land where the keys are. Elsewhere the client given is used as it is. Also what these tools share
on that client: the server's clock from ``TIME`` (every age is measured by it) and key names made
safe for a ``SCAN MATCH`` pattern.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from ._redis.connection import ClusterMode, RedisLike, resolve_client, slot_owner

__all__ = ["glob_escape", "on_owner", "owner", "time_ms"]


@asynccontextmanager
async def on_owner(
    client: aioredis.Redis | RedisCluster, key: str, *, refresh: bool = False
) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    """``(plain client, node)`` for ``key``: ``client`` itself and "" when it is not a cluster, else a
    client of the master owning ``key``'s slot (the slot map read again with ``refresh``) and that
    master's ``host:port``, closed on the way out."""
    if not isinstance(client, RedisCluster):
        yield client, ""
        return
    node, name = await slot_owner(client, key, refresh=refresh)
    try:
        yield node, name
    finally:
        await node.aclose()


@asynccontextmanager
async def owner(
    redis: RedisLike, key: str, *, cluster: bool | ClusterMode = ClusterMode.NONE
) -> AsyncIterator[aioredis.Redis]:
    """A plain client of the Redis that holds ``key`` (:func:`on_owner`), from what the public API
    takes as ``redis`` (a client is left open, a URL opened and closed here)."""
    client, owned = resolve_client(redis, cluster=cluster)
    try:
        async with on_owner(client, key) as (r, _):
            yield r
    finally:
        if owned:
            await client.aclose()


def time_ms(reply: Any) -> int:
    """A ``TIME`` reply as ms since the epoch: the server's clock, which ages are measured by."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def glob_escape(text: str) -> str:
    """``text`` with the characters special in Redis's glob patterns (SCAN MATCH) backslash-escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
