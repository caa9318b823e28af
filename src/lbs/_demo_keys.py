"""The demo's keys: every key it writes is one of its service's, it refuses to start on a Redis
that has any of them, and deletes them all at the end (see :mod:`lbs._demo`)."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from . import _keys
from ._admin import glob_escape
from ._demo_keyed import keyed_service
from ._redis.connection import server_name
from .exceptions import ConfigurationError, RedisOperationError, ServerError

#: The oldest Redis the demo runs on (with --redis-url); lbs's fallbacks cover 7.x.
MIN_REDIS = (7, 0)


class ServiceInUseError(ConfigurationError):
    """Raised when the Redis the demo is to run on already has keys of its service: the demo writes
    and deletes only keys of a service of its own, so it refuses to start."""


def data_stream(service: str, name: str) -> str:
    """The demo's data stream ``name``: ``{<service>-input}:<name>``, under the service's hash tag."""
    return f"{_keys.hash_tag(service)}:{name}"


def demo_keys(service: str) -> tuple[list[str], list[str]]:
    """What the demo writes with ``service``: ``(names, prefixes)``.

    Every key it writes is one of ``names`` (the two LBS streams) or starts
    with one of ``prefixes`` (the services' hash tags, and the lock per
    entry's ``lock:{...}:``, which lbs no longer writes but the demo still
    counts as its own), for ``service`` and for the keyed scenario's
    ``<service>-tickets``.
    """
    services = [service, keyed_service(service)]
    names = [_keys.input_stream(s) for s in services]
    prefixes = [p for s in services for p in (_keys.key_prefix(s), _keys.lock_key(s, ""))]
    return names, prefixes


def describe_keys(service: str) -> str:
    """The demo's keys as glob patterns, for messages."""
    return (
        f"{_keys.input_stream(service)}, {_keys.key_prefix(service)}*, {_keys.lock_key(service, '*')} "
        f"and the same for {keyed_service(service)}"
    )


async def find_demo_keys(r: aioredis.Redis, service: str) -> list[str]:
    """Every key in ``r`` that the demo with ``service`` would write (sorted), in one SCAN."""
    names, prefixes = demo_keys(service)
    found = {n for n in names if await r.exists(n)}
    # Every prefix holds "{<service>-"; the SCAN match narrows by it, the check here is exact.
    tag = "{" + glob_escape(service) + "-"
    async for raw in r.scan_iter(match=f"*{tag}*", count=10_000):
        key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if key.startswith(tuple(prefixes)):
            found.add(key)
    return sorted(found)


async def check_server(r: aioredis.Redis, service: str) -> str:
    """Refuse to start unless ``r`` is reachable, runs Redis >= :data:`MIN_REDIS` and holds no key of the demo's;
    what the server is: "Redis 8.6.3", "Valkey 9.1.2" (which answers as Redis 7.2.4).

    Raises :class:`RedisOperationError` (unreachable), :class:`ServerError`
    (too old) or :class:`ServiceInUseError` (keys of ``service`` exist).
    """
    try:
        info = await r.info("server")
        found = await find_demo_keys(r, service)
    except RedisError as exc:
        raise RedisOperationError("reaching Redis", exc) from exc
    version = tuple(int(p) for p in str(info["redis_version"]).split(".")[:2])
    if version < MIN_REDIS:
        raise ServerError(
            f"the demo needs Redis >= {'.'.join(map(str, MIN_REDIS))}; "
            f"this one is {' '.join(server_name(info))}"
        )
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ServiceInUseError(
            f"this Redis already has keys that the demo with service {service!r} would write and delete "
            f"({shown}; its keys are {describe_keys(service)}): pick another --service"
        )
    return " ".join(server_name(info))


async def delete_demo_keys(r: aioredis.Redis, service: str) -> int:
    """Delete every key of the demo's with ``service``; how many there were."""
    found = await find_demo_keys(r, service)
    for i in range(0, len(found), 500):
        await r.delete(*found[i : i + 500])
    return len(found)
