"""The services on a Redis (every master of a cluster), and what the operator's tools say of a
service that is not there.

A service exists where its load-balancer stream ``<service>-input`` does (:func:`lbs.input_stream`):
:func:`list_services` SCANs each master for streams matching ``*-input`` (``SCAN ... TYPE stream``);
a key with a brace is left out (a service's name has none, :func:`lbs._keys.validate_service`: the
keys under its hash tag, ``{<service>-input}:...``, are its bookkeeping, not services).
:func:`service_summaries` adds each one's backlog, pending, consumers and dead letters, read as
``lbs status`` reads them (:func:`lbs.status.collect_status`).

:func:`require_service` is the tools' check of a name they are given (``lbs status``, ``lbs dlq``,
``lbs claim``, ``lbs dashboard``): one ``EXISTS`` when the service is there; when it is not, a
:class:`lbs.NoSuchServiceError` whose message names the Redis (its URL masked) and the closest
existing names (:func:`missing_message`). ``lbs worker`` starts a service that is not there yet, but
says so first (:func:`new_service_message`).
"""

from __future__ import annotations

import asyncio
import difflib
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from .. import _keys
from .._admin import owner
from .._redis.connection import ClusterMode, RedisLike, node_client, resolve_client
from .._urlmask import mask_url
from ..config import Config
from ..exceptions import LbsError, NoSuchServiceError, RedisOperationError
from .reader import collect_status
from .records import ServiceStatus, _Record

__all__ = [
    "ServiceSummary",
    "list_services",
    "missing_message",
    "new_service_message",
    "new_service_warning",
    "require_service",
    "service_of",
    "service_summaries",
]

_SUFFIX = _keys.input_stream("")
#: How many names a message lists when none is close to the one given.
NAMES_SHOWN = 10
#: Why :func:`missing_message` names no service: the ACL refused the SCAN.
_REFUSED = "the ACL refuses SCAN"
#: Status reads in flight at once for :func:`service_summaries`.
CONCURRENT_READS = 8


def service_of(key: str) -> str | None:
    """The service whose load-balancer stream ``key`` is (``orders-input`` -> ``orders``), or None."""
    if not key.endswith(_SUFFIX) or len(key) == len(_SUFFIX) or "{" in key or "}" in key:
        return None
    return key[: -len(_SUFFIX)]


@asynccontextmanager
async def _masters(client: aioredis.Redis | RedisCluster) -> AsyncIterator[list[aioredis.Redis]]:
    """A plain client of each master: ``client`` itself when it is not a cluster."""
    if not isinstance(client, RedisCluster):
        yield [client]
        return
    await client.initialize()
    nodes = [node_client(n) for n in client.get_primaries()]
    try:
        yield nodes
    finally:
        for node in nodes:
            await node.aclose()


async def _scan(client: aioredis.Redis | RedisCluster) -> list[str]:
    found: set[str] = set()
    async with _masters(client) as masters:
        for r in masters:
            async for raw in r.scan_iter(match="*" + _SUFFIX, count=1000, _type="stream"):
                key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                name = service_of(key)
                if name is not None:
                    found.add(name)
    return sorted(found)


async def list_services(
    redis: RedisLike, *, cluster: bool | ClusterMode = ClusterMode.NONE
) -> list[str]:
    """The services on ``redis``, by name: each stream ``<service>-input`` of each master.

    ``redis`` is a redis.asyncio client, a ``RedisCluster`` (or ``cluster=True``; every master is
    scanned) or a URL (opened and closed here). A failing Redis raises
    :class:`lbs.RedisOperationError`. A stream of the application's own named ``...-input`` is
    listed too: only the name tells an LBS.
    """
    client, owned = resolve_client(redis, cluster=cluster)
    try:
        return await _scan(client)
    except (RedisError, RedisClusterException) as exc:
        raise RedisOperationError("list services", exc) from exc
    finally:
        if owned:
            await client.aclose()


@dataclass(frozen=True)
class ServiceSummary(_Record):
    """One service in :func:`service_summaries`: what ``lbs status`` counts, in one row."""

    service: str
    #: Its load-balancer stream, ``<service>-input``.
    stream: str
    #: On a cluster the ``host:port`` of the master owning the service's slot ("" otherwise).
    node: str
    #: Entries not yet delivered to the group, and whether that is a count (not an estimate).
    backlog: int
    backlog_exact: bool
    #: Entries delivered and not finished.
    pending: int
    #: Consumers by state, as `lbs status` judges them (the departed are not counted).
    alive: int
    late: int
    dead: int
    dead_letters: int
    #: Why the service could not be read (a key of the wrong type, an ACL): "" when it was.
    error: str = ""

    @classmethod
    def of(cls, st: ServiceStatus) -> ServiceSummary:
        return cls(
            st.service,
            st.stream,
            st.node,
            st.backlog,
            st.backlog_exact,
            st.pending,
            st.count("alive"),
            st.count("late"),
            st.count("dead"),
            st.dead_letters,
        )


async def service_summaries(
    redis: RedisLike,
    *,
    cluster: bool | ClusterMode = ClusterMode.NONE,
    config: Config | None = None,
    names: Sequence[str] | None = None,
) -> list[ServiceSummary]:
    """Every service on ``redis`` (:func:`list_services`; or only ``names``) with its backlog,
    pending, consumers and dead letters (:func:`lbs.status.collect_status`, a few at a time).

    A service that cannot be read (a key of the wrong type) is listed with its :attr:`error`; a
    failing Redis raises :class:`lbs.RedisOperationError`.
    """
    client, owned = resolve_client(redis, cluster=cluster)
    gate = asyncio.Semaphore(CONCURRENT_READS)

    async def one(name: str) -> ServiceSummary:
        async with gate:
            try:
                return ServiceSummary.of(
                    await collect_status(client, name, config=config, letters=0)
                )
            except RedisOperationError as exc:
                if not isinstance(exc.cause, ResponseError):  # not an answer of this service's keys
                    raise
                stream = _keys.input_stream(name)
                return ServiceSummary(name, stream, "", 0, False, 0, 0, 0, 0, 0, str(exc))

    try:
        listed = await _scan(client) if names is None else list(names)
        return list(await asyncio.gather(*(one(n) for n in listed)))
    except LbsError:
        raise
    except (RedisError, RedisClusterException) as exc:
        raise RedisOperationError("list services", exc) from exc
    finally:
        if owned:
            await client.aclose()


# ---------------------------------------------------------- a name that is not there ---


def _quoted(names: Sequence[str]) -> str:
    return " or ".join(repr(n) for n in names)


def _candidates(names: Sequence[str], shards: int) -> list[str]:
    """What a name given with ``shards`` is compared with: the names, or their sharded bases."""
    if shards == 1:
        return list(names)
    return sorted({m.group(1) for n in names if (m := re.fullmatch(r"(.+)\.\d+(?:~\d+)?", n))})


def _close(service: str, names: Sequence[str]) -> list[str]:
    return difflib.get_close_matches(service, names, n=3, cutoff=0.6)


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return shown + (f" and {more} more (lbs services lists them)" if more > 0 else "")


def missing_message(
    service: str, names: Sequence[str] | None, where: str, *, shards: int = 1
) -> str:
    """``no service 'jbos' on <where>; did you mean 'jobs'?``: the closest of ``names`` (the services
    there), else those there are (at most :data:`NAMES_SHOWN`), or that there are none (``names``
    None: they could not be listed)."""
    head = f"no service {service!r} on {where}"
    if names is None:
        return f"{head} (the services there could not be listed: {_REFUSED})"
    names = _candidates(names, shards)
    close = _close(service, names)
    if close:
        return f"{head}; did you mean {_quoted(close)}?"
    if names:
        return f"{head}; the services there: {_listed(names)}"
    return f"{head}; it has no services (no stream named SERVICE{_SUFFIX})"


def new_service_message(
    service: str, names: Sequence[str] | None, where: str, *, shards: int = 1
) -> str:
    """``service 'jbos' does not exist on <where> yet: starting it (did you mean 'jobs'?)``, or
    ``(existing: a, b)``: what ``lbs worker`` says before it starts a service that is not there."""
    head = f"service {service!r} does not exist on {where} yet: starting it"
    if names is None:
        return f"{head} (the services there could not be listed: {_REFUSED})"
    names = [n for n in _candidates(names, shards) if n != service]
    close = _close(service, names)
    if close:
        known = f"did you mean {_quoted(close)}?"
    else:
        known = "existing: " + (", ".join(names[:NAMES_SHOWN]) if names else "none")
        if len(names) > NAMES_SHOWN:
            known += f" and {len(names) - NAMES_SHOWN} more"
    return f"{head} ({known})"


def _where(redis: RedisLike, where: str | None) -> str:
    if where is not None:
        return where
    return mask_url(redis) if isinstance(redis, str) else "this Redis"


async def _lookup(
    redis: RedisLike, service: str, shards: int, dead_letters: bool, cluster: bool | ClusterMode
) -> tuple[bool, list[str] | None]:
    """``(True, None)`` when ``service`` exists (one ``EXISTS`` per shard: its LBS, or its parking
    stream, where registrations still scheduled wait); else ``(False, the services there)`` (a SCAN;
    None when the ACL refuses it)."""
    _keys.validate_service(service)
    client, owned = resolve_client(redis, cluster=cluster)
    try:
        for name in _keys.shard_services(service, shards):
            stream = _keys.input_stream(name)
            keys = [stream, _keys.delayed_stream(name)]
            if dead_letters:
                keys.append(_keys.dead_letter_stream(name))
            async with owner(client, stream) as r:
                if await r.exists(*keys):
                    return True, None
        try:
            return False, await _scan(client)
        except ResponseError:  # NOPERM: the name is still refused, without suggestions
            return False, None
    except (RedisError, RedisClusterException) as exc:
        raise RedisOperationError("look the service up", exc) from exc
    finally:
        if owned:
            await client.aclose()


async def require_service(
    redis: RedisLike,
    service: str,
    *,
    shards: int = 1,
    dead_letters: bool = False,
    where: str | None = None,
    cluster: bool | ClusterMode = ClusterMode.NONE,
) -> None:
    """Return if ``service`` exists on ``redis`` (its load-balancer stream, or with ``dead_letters``
    its dead-letter stream; with ``shards`` above 1, any shard's); else raise
    :class:`lbs.NoSuchServiceError` (:func:`missing_message`; ``where`` names the Redis, by default
    its URL masked).

    One ``EXISTS`` when it is there; the SCAN of :func:`list_services` only when it is not. A failing
    Redis raises :class:`lbs.RedisOperationError`.
    """
    found, names = await _lookup(redis, service, _keys.check_shards(shards), dead_letters, cluster)
    if found:
        return
    message = missing_message(service, names, _where(redis, where), shards=shards)
    close = _close(service, _candidates(names or (), shards))
    raise NoSuchServiceError(message, service, tuple(close))


async def new_service_warning(
    redis: RedisLike,
    service: str,
    *,
    shards: int = 1,
    where: str | None = None,
    cluster: bool | ClusterMode = ClusterMode.NONE,
) -> str | None:
    """None when ``service`` exists on ``redis`` (any shard's load-balancer stream), else what
    :func:`new_service_message` says of it. Errors as :func:`require_service`'s."""
    found, names = await _lookup(redis, service, _keys.check_shards(shards), False, cluster)
    if found:
        return None
    return new_service_message(service, names, _where(redis, where), shards=shards)
