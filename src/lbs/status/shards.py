"""A sharded service's placement (``lbs status SERVICE --shards N``): each shard's hash slot, the
master owning it, and its status; the legacy shards that still exist; how many shards each master
owns.

Shard ``i`` of ``N`` is named so that its slot lies in the middle of the ``i``-th of N equal slot
ranges (:mod:`lbs._placement`): on masters owning equal ranges each carries N / M shards (one more
or fewer when M does not divide N). A cluster whose masters own unequal ranges does not: this is
where an operator sees it (:attr:`ShardedStatus.balanced`) before moving slots with the cluster's
own tools. *Legacy* shards are those a :class:`lbs.ShardedClient` also reads while their LBS exists:
the earlier names of moved shards (:func:`lbs._placement.legacy_names`) and, with
``previous_shards``, the shards of a layout being left. One is listed while any of its keys that
the status reads exists (its LBS, parked retries, dead letters), with what it still holds, so that
the operator knows when its keys can be deleted.

Each shard's status is :func:`lbs.status.collect_status`, read from the master owning its slot.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from .. import _keys
from .._placement import legacy_names, slot_of
from .._redis.connection import ClusterMode, RedisLike, resolve_client
from ..config import Config
from ..exceptions import ConfigurationError, LbsError, RedisOperationError
from .reader import collect_status
from .records import ServiceStatus, _Record

__all__ = ["ShardStatus", "ShardedStatus", "collect_shards", "legacy_candidates"]


@dataclass(frozen=True)
class ShardStatus(_Record):
    """One shard of a sharded service: where it lives and what it holds."""

    #: The shard's service name (``<service>.<i>`` or ``<service>.<i>~<j>``; one shard: the service).
    name: str
    #: Its index in its layout, and that layout's shard count.
    index: int
    of: int
    #: The hash slot of its keys (``CRC16("<name>-input") mod 16384``), on a single Redis too.
    slot: int
    #: ``host:port`` of the master that owned the slot when read; a single Redis: that server.
    node: str
    #: Whether consumers read it only while it exists: a moved shard's earlier name, or a shard of
    #: a layout being left (``previous_shards``).
    legacy: bool
    #: Why it is legacy ("" for a shard of the layout).
    why: str
    status: ServiceStatus

    @property
    def empty(self) -> bool:
        """Whether it holds no work: nothing waiting, pending or parked."""
        st = self.status
        parked = st.delayed.parked + st.delayed.scheduled if st.delayed else 0
        return st.length == 0 and st.pending == 0 and parked == 0

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "empty": self.empty}


@dataclass(frozen=True)
class ShardedStatus(_Record):
    """A sharded service's shards and how they are spread over the masters."""

    service: str
    #: The layout's shard count (N) and the counts of layouts being left.
    shard_count: int
    previous_shards: tuple[int, ...]
    #: Whether it was read on a Redis Cluster.
    cluster: bool
    #: The layout's shards in order, then the legacy shards that still exist.
    shards: tuple[ShardStatus, ...]
    #: How many of the layout's shards each master owns (every master of a cluster, 0 included).
    masters: dict[str, int]

    @property
    def balanced(self) -> bool:
        """Whether the masters' shard counts differ by at most one."""
        counts = list(self.masters.values())
        return not counts or max(counts) - min(counts) <= 1

    @property
    def exists(self) -> bool:
        """Whether any shard (of the layout, or legacy) exists."""
        return any(s.status.exists or s.status.delayed for s in self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "balanced": self.balanced}


def legacy_candidates(
    service: str, shards: int, previous_shards: tuple[int, ...] = ()
) -> list[tuple[str, int, int, str]]:
    """``(name, index, of, why)`` of every shard a :class:`lbs.ShardedClient` of ``service`` with
    ``shards`` and ``previous_shards`` reads while it exists, besides the layout's own."""
    now = set(_keys.shard_services(service, shards))
    out: dict[str, tuple[str, int, int, str]] = {}
    earlier = "named by an earlier lbs"
    for n, own in [(shards, False)] + [(m, True) for m in previous_shards]:
        if own:
            for i, name in enumerate(_keys.shard_services(service, n)):
                out.setdefault(name, (name, i, n, f"shard {i} of the {n}-shard layout being left"))
        for name in legacy_names(service, n):
            i = int(name.rsplit(".", 1)[1])
            out.setdefault(name, (name, i, n, f"{earlier} (shard {i} of {n})"))
    return [c for name, c in out.items() if name not in now]


async def collect_shards(
    redis: RedisLike,
    service: str,
    shards: int,
    *,
    previous_shards: tuple[int, ...] | list[int] = (),
    cluster: bool | ClusterMode = ClusterMode.NONE,
    config: Config | None = None,
    letters: int = 100,
    sample: int = 200,
) -> ShardedStatus:
    """Read every shard of ``service`` in ``shards`` shards (:func:`collect_status` each, on the
    master owning its slot) and the legacy shards that still exist (:func:`legacy_candidates`).

    ``redis``, ``cluster``, ``config``, ``letters`` and ``sample`` as for :func:`collect_status`.
    A failing Redis raises :class:`lbs.RedisOperationError`; a bad argument
    :class:`lbs.ConfigurationError`.
    """
    _keys.validate_service(service)
    n = _keys.check_shards(shards)
    if isinstance(previous_shards, (str, bytes)):
        raise ConfigurationError("previous_shards must be a list of shard counts")
    previous = tuple(_keys.check_shards(m) for m in previous_shards)
    client, owned = resolve_client(redis, cluster=cluster)
    try:
        own = [(name, i, n, "") for i, name in enumerate(_keys.shard_services(service, n))]
        candidates = legacy_candidates(service, n, previous)
        # One EXISTS each first: most earlier names hold nothing, and a status read is two MULTIs.
        probed = await asyncio.gather(*(_exists(client, c[0], config) for c in candidates))
        others = [c for c, there in zip(candidates, probed, strict=True) if there]
        read = await asyncio.gather(
            *(
                collect_status(client, name, config=config, letters=letters, sample=sample)
                for name, _, _, _ in own + others
            )
        )
        here = "" if isinstance(client, RedisCluster) else server_address(client)
        found = []
        for (name, i, of, why), st in zip(own + others, read, strict=True):
            legacy = bool(why)
            if legacy and not (st.exists or st.delayed or st.dead_letters):
                continue
            found.append(ShardStatus(name, i, of, slot_of(name), st.node or here, legacy, why, st))
        masters = dict.fromkeys(await _masters(client, here), 0)
        for shard in found:
            if not shard.legacy:
                masters[shard.node] = masters.get(shard.node, 0) + 1
        return ShardedStatus(
            service, n, previous, isinstance(client, RedisCluster), tuple(found), masters
        )
    except LbsError:
        raise
    except (RedisError, RedisClusterException) as exc:
        raise RedisOperationError("status", exc) from exc
    finally:
        if owned:
            await client.aclose()


async def _exists(client: aioredis.Redis | RedisCluster, name: str, config: Config | None) -> bool:
    """Whether any of the keys of shard ``name`` that the status reads as work exists: its LBS,
    parked retries, dead letters (all in one slot: one EXISTS)."""
    keys = [_keys.input_stream(name), _keys.delayed_stream(name), _keys.due_key(name)]
    if config is None or config.dead_letter_stream is None:
        keys.append(_keys.dead_letter_stream(name))
    return bool(await client.exists(*keys))


async def _masters(client: aioredis.Redis | RedisCluster, here: str) -> list[str]:
    """Every master's ``host:port`` (a single Redis: its own address), sorted."""
    if not isinstance(client, RedisCluster):
        return [here]
    await client.initialize()
    return sorted(node.name for node in client.get_primaries())


def server_address(client: aioredis.Redis) -> str:
    """The address a plain client connects to: ``host:port``, a Unix socket's path, or "this Redis"."""
    kw = client.connection_pool.connection_kwargs
    if kw.get("path"):
        return str(kw["path"])
    if kw.get("host"):
        return f"{kw['host']}:{kw.get('port', 6379)}"
    return "this Redis"
