"""The operator's client: a plain client of the Redis that holds a key (on a cluster, its slot's master).

``lbs status``, :class:`lbs.DeadLetters` and ``lbs claim`` read and write one service's keys, all under
its hash tag: on Redis Cluster they talk to the master owning that slot through a plain client built
from the node's own settings (:func:`lbs._redis.connection.slot_owner`), so pipelines and MULTI/EXEC
land where the keys are. Elsewhere the client given is used as it is. Also what these tools share
on that client: the server's clock from ``TIME`` (every age is measured by it) and key names made
safe for a ``SCAN MATCH`` pattern; and :class:`ServiceHandle`, what :class:`lbs.ServiceControls` and
:class:`lbs.DeadLetters` are made from.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from . import _keys
from ._redis.connection import ClusterMode, RedisLike, resolve_client, slot_owner
from .config import Config
from .exceptions import ConfigurationError

__all__ = ["ServiceHandle", "glob_escape", "on_owner", "owner", "time_ms"]


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


class ServiceHandle:
    """One service as an operator's API reaches it: its name (checked), its :class:`lbs.Config`
    (the defaults when none), its load-balancer stream, and the client from ``redis`` (a client is
    left open, a URL opened here: ``_owned``) that reaches them."""

    def __init__(
        self,
        redis: RedisLike,
        service: str,
        *,
        config: Config | None = None,
        cluster: bool | ClusterMode = ClusterMode.NONE,
    ) -> None:
        self.service = _keys.validate_service(service)
        if config is not None and not isinstance(config, Config):
            raise ConfigurationError(f"config must be an lbs.Config, got {type(config).__name__}")
        self.config = config or Config()
        self.stream = _keys.input_stream(service)
        self._configured()
        self._client, self._owned = resolve_client(redis, cluster=cluster)

    def _configured(self) -> None:
        """A subclass's own checks and settings, once ``config`` is known and before the client is
        made (none here)."""


def time_ms(reply: Any) -> int:
    """A ``TIME`` reply as ms since the epoch: the server's clock, which ages are measured by."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def glob_escape(text: str) -> str:
    """``text`` with the characters special in Redis's glob patterns (SCAN MATCH) backslash-escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
