"""Turning the ``redis`` argument of the public API into a client, and routing on a cluster.

Every key of one service shares the hash tag ``{<service>-input}``, so all of
a client's commands go to the master that owns that one slot. On Redis
Cluster lbs therefore talks to that master through a plain
``redis.asyncio.Redis`` built from the cluster node's own connection
settings (TLS, AUTH and RESP version stay what the application gave the
cluster client): scripts, batches, blocking reads and the keyspace
subscription all land on the owner, where the consumers' leases expire.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Iterable, Mapping
from typing import Any, Union

import redis.asyncio as aioredis
from redis import Redis as SyncRedis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .. import _keys
from .._urlmask import mask_secrets, mask_url
from ..exceptions import ConfigurationError, RedisOperationError
from .errors import BusyGroupError, SlotMovedError, classify, replied
from .sentinel import is_sentinel_url, sentinel_client
from .wire import text

#: What the public API accepts as ``redis``: a redis.asyncio client (a Sentinel's ``master_for`` one
#: too), a ``RedisCluster``, or a URL (``redis+cluster://`` / ``rediss+cluster://`` for a cluster,
#: ``redis+sentinel://`` / ``rediss+sentinel://`` for the master a set of Sentinels names).
RedisLike = Union["aioredis.Redis", "RedisCluster", str]

_CLUSTER_SCHEMES = {"redis+cluster://": "redis://", "rediss+cluster://": "rediss://"}


class ClusterMode(enum.Enum):
    """How lbs reaches Redis (the ``cluster`` argument of Client, Producer and ShardedClient)."""

    #: One endpoint: a single Redis, or a proxy in front of many (Redis Enterprise). The default.
    NONE = "none"
    #: Redis OSS Cluster: lbs finds the master owning each service's slot and follows it.
    OSS = "oss"


def cluster_url(url: str) -> tuple[str, bool]:
    """``url`` as redis-py takes it, and whether its scheme names a cluster:
    ``redis+cluster://`` -> ``redis://`` and ``rediss+cluster://`` -> ``rediss://`` (True); any
    other URL as it is (False)."""
    for scheme, plain in _CLUSTER_SCHEMES.items():
        if url.startswith(scheme):
            return plain + url[len(scheme) :], True
    return url, False


def resolve_client(
    redis: RedisLike, *, cluster: bool | ClusterMode = ClusterMode.NONE
) -> tuple[aioredis.Redis | RedisCluster, bool]:
    """Return ``(client, owned)``; ``owned`` clients are closed by lbs.

    A URL opens a cluster client when its scheme is ``redis+cluster://``
    (``rediss+cluster://``) or ``cluster`` is ``ClusterMode.OSS`` (or True), and a client of the
    master the Sentinels name when it is ``redis+sentinel://`` (:mod:`lbs._redis.sentinel`).
    A client object says what it is: a ``RedisCluster`` is a cluster.
    A URL redis-py cannot use (scheme, port, options) raises
    :class:`lbs.ConfigurationError` naming it, its password masked; no
    connection is made here.
    """
    if not isinstance(cluster, (bool, ClusterMode)):
        raise ConfigurationError(f"cluster must be a bool or an lbs.ClusterMode, got {cluster!r}")
    oss = cluster is True or cluster is ClusterMode.OSS
    if isinstance(redis, str):
        url = redis
        try:
            if is_sentinel_url(url):
                if oss:
                    raise ConfigurationError(
                        "a redis+sentinel:// URL names one master, not a cluster"
                    )
                return sentinel_client(url), True
            plain, named = cluster_url(url)
            if named or oss:
                return RedisCluster.from_url(plain), True
            client = aioredis.Redis.from_url(url)
            # redis-py makes connections on first use: make one now (no I/O) so
            # that an option the connection does not take fails here, not there.
            client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
            return client, True
        except Exception as exc:  # from_url does no I/O: whatever it raises is about the URL
            # The password masked in the URL and in redis-py's message; from None: redis-py's own
            # exception (kept as __context__) may show it.
            message = mask_secrets(url, f"invalid Redis URL {mask_url(url)!r}: {exc}")
            raise ConfigurationError(message) from None
    if isinstance(redis, (aioredis.Redis, RedisCluster)):
        return redis, False
    raise ConfigurationError(
        "redis must be a redis.asyncio.Redis or RedisCluster client or a URL string, "
        f"got {type(redis).__name__}"
    )


def open_plain(url: str) -> aioredis.Redis:
    """A client of one Redis from ``url`` (``redis://``, ``rediss://``, or ``redis+sentinel://``: the
    master the Sentinels name), for the tools that talk to one server (demo, bench); the caller
    closes it."""
    return sentinel_client(url) if is_sentinel_url(url) else aioredis.Redis.from_url(url)


def node_client(node: ClusterNode) -> aioredis.Redis:
    """A plain client for one cluster node, with the node's connection settings."""
    accepted = set(inspect.signature(node.connection_class.__init__).parameters)
    kwargs = {k: v for k, v in node.connection_kwargs.items() if k in accepted}
    pool = aioredis.ConnectionPool(connection_class=node.connection_class, **kwargs)
    return aioredis.Redis.from_pool(pool)  # closing the client closes the pool


def first_node_client(cluster: RedisCluster) -> aioredis.Redis:
    """A plain client for the cluster's first startup node (no I/O; routed later)."""
    node = next(iter(cluster.nodes_manager.startup_nodes.values()))
    return node_client(node)


async def owner_node(cluster: RedisCluster, key: str, *, refresh: bool = False) -> ClusterNode:
    """The master that owns ``key``'s slot (the slot map read once, or again with ``refresh``)."""
    await cluster.initialize()  # once: topology and the command parser
    if refresh:
        await cluster.nodes_manager.initialize()
    node = cluster.get_node_from_key(key)
    if node is None:
        raise ConfigurationError(f"no cluster node owns the slot of {key!r}")
    return node


async def slot_owner(
    cluster: RedisCluster, key: str, *, refresh: bool = False
) -> tuple[aioredis.Redis, str]:
    """A plain client for the master that owns ``key``'s slot, and that master's ``host:port``."""
    node = await owner_node(cluster, key, refresh=refresh)
    return node_client(node), node.name


#: Replies of a node that does not (or cannot now) serve the key's slot: the command ran nowhere.
#: redis-py's classes (MASTERDOWN is a ClusterDownError) and lbs's wire's (lbs._redis.errors).
_REDIRECTS = (MovedError, AskError, SlotMovedError, ClusterDownError, TryAgainError, ReadOnlyError)


def redirected(reply: object) -> bool:
    """Whether ``reply`` (an error value or a raised exception) says the command ran nowhere
    because this node does not own the slot now."""
    return isinstance(reply, _REDIRECTS)


def parse_version(raw: object) -> tuple[int, ...]:
    """``"8.6.3"`` -> ``(8, 6, 3)``; ``()`` when it is not a dotted version."""
    try:
        return tuple(int(p) for p in str(raw).split("."))
    except ValueError:
        return ()


def server_name(info: Mapping[str, Any]) -> tuple[str, str]:
    """(product, version) from ``INFO server``: ``("Valkey", "9.0.1")`` for Valkey (which also reports the
    Redis version it is compatible with, ``redis_version:7.2.4``: what lbs's feature checks go by), else
    ``("Redis", redis_version)``."""
    if str(info.get("server_name", "")).lower() == "valkey" and info.get("valkey_version"):
        return "Valkey", str(info["valkey_version"])
    return "Redis", str(info.get("redis_version", ""))


async def ensure_group(redis: aioredis.Redis, stream: str, group: str, *, at: str = "0") -> bool:
    """Create ``group`` on ``stream`` (and the stream) unless it exists; whether this call created it.

    Id 0 unless ``at`` says otherwise, not $: entries added before any consumer existed are delivered.
    """
    try:
        await replied(redis.xgroup_create(stream, group, id=at, mkstream=True))
    except BusyGroupError:
        return False
    return True


def ensure_group_sync(
    redis: SyncRedis | SyncRedisCluster, stream: str, group: str, *, at: str = "0"
) -> bool:
    """:func:`ensure_group` on a synchronous client (the Spark source's driver), from id ``at``."""
    try:
        redis.xgroup_create(stream, group, id=at, mkstream=True)
    except ResponseError as exc:
        if not isinstance(classify(exc), BusyGroupError):
            raise
        return False
    return True


#: Entries counted at most, a page at a time, when the server cannot tell a group's lag.
SKIPPED_COUNT_LIMIT = 10_000


async def skipped_entries(redis: aioredis.Redis, service: str) -> tuple[int, str, bool]:
    """Entries of ``service``'s LBS that its group will never deliver: at or below its last-delivered
    id, not pending and not waiting for their data stream's holder (a group created at ``$`` after
    they were added, as the Go client v0.4 does).

    Returns (count, the group's last-delivered id, whether the count is a lower bound). Counted
    from the group's lag where the server knows it (7.0+, no deletion inside the range), else
    by reading up to :data:`SKIPPED_COUNT_LIMIT` entries.
    """
    stream, group = _keys.input_stream(service), _keys.group_name(service)
    info = next((g for g in await redis.xinfo_groups(stream) if text(g.get("name")) == group), None)
    if info is None:
        return 0, "0-0", False
    last, pending = text(info.get("last-delivered-id") or "0-0"), int(info.get("pending") or 0)
    if last == "0-0":
        return 0, last, False
    # Registrations waiting for their data stream's holder are read and acked but kept in the stream.
    waiting = await waiting_registrations(redis, service)
    if waiting is None:
        return 0, last, False  # too many names wait to count them: cannot tell
    pending += waiting
    lag = info.get("lag")
    if lag is not None:
        return max(0, int(await redis.xlen(stream)) - int(lag) - pending), last, False
    seen, start = 0, "-"
    while seen < SKIPPED_COUNT_LIMIT:
        page = await redis.xrange(stream, start, last, count=1000) or []
        seen += len(page)
        if len(page) < 1000:
            return max(0, seen - pending), last, False
        start = "(" + text(page[-1][0])
    return max(0, seen - pending), last, True


#: Most names :func:`waiting_registrations` counts the waiters of.
WAITING_COUNT_LIMIT = 1000


async def waiting_names(redis: aioredis.Redis, service: str, count: int) -> list[bytes]:
    """The first ``count`` names of ``service``'s waiting index (names with registrations waiting for
    their holder, by when the sweep looks at them again), as stored: bytes, whatever their encoding."""
    return [
        n if isinstance(n, bytes) else str(n).encode()
        for n in await redis.zrange(_keys.waiting_key(service), 0, count - 1)
    ]


async def waiting_registrations(redis: aioredis.Redis, service: str) -> int | None:
    """Registrations of ``service`` that wait for their data stream's holder (one holder per name):
    read, acked and kept in the LBS, listed in their name's waiting list. None when more than
    :data:`WAITING_COUNT_LIMIT` names have waiters."""
    names = await waiting_names(redis, service, WAITING_COUNT_LIMIT + 1)
    if len(names) > WAITING_COUNT_LIMIT:
        return None
    if not names:
        return 0
    prefix = _keys.waiting_list(
        service, ""
    ).encode()  # names as stored: bytes, whatever their encoding
    async with redis.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.llen(prefix + name)
        return sum(int(n) for n in await execute(pipe))


def topology_error(exc: BaseException) -> bool:
    """Whether ``exc`` may mean the slot's owner changed, or Redis is unreachable (worth trying again)."""
    if isinstance(exc, RedisOperationError) and exc.cause is not None:
        exc = exc.cause
    return redirected(exc) or isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError))


async def execute(pipe: Any, *, raise_on_error: bool = True) -> list[Any]:
    """Run a pipeline and always reset it, so a failed one leaves no connection behind (with
    ``raise_on_error=False`` an error reply comes back in its place, as the exception). Error
    replies are classified (:func:`lbs._redis.errors.classify`), raised or returned."""
    try:
        replies = await replied(pipe.execute(raise_on_error=raise_on_error))
    finally:
        await pipe.reset()
    if raise_on_error:
        return replies  # type: ignore[no-any-return]
    return [classify(r) if type(r) is ResponseError else r for r in replies]


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
