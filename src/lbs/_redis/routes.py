"""Wires to the Redis that serves each load-balancer stream, for the producing side.

On one Redis there is one wire. On a cluster, lbs talks to the master that
owns an LBS's slot through a plain client of its own (made on first use, one
per master), so a batch goes out as one write with the core's encoding and
is never re-sent behind the caller's back: redis-py's cluster client retries
a command whose connection failed, which would run a non-idempotent script
(an XADD) twice. A redirect (the slot moved) means the batch ran nowhere:
:meth:`Routes.forget` reads the slot map again for a second try.

Used by :class:`lbs.Producer` and :class:`lbs.Publisher`, through :class:`Sender`: what the two
share.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ReadOnlyError, RedisClusterException, RedisError

from _lbscore import EntryParser

from .. import _keys, _schedule
from ..exceptions import RedisOperationError
from ..plugins import make_plugin_manager, merged_fields
from .connection import (
    ClusterMode,
    RedisLike,
    node_client,
    owner_node,
    redirected,
    resolve_client,
)
from .wire import Wire

__all__ = ["Routes", "Sender"]

log = logging.getLogger("lbs.producer")


class Routes:
    """A wire per Redis that serves a key: the client's own, or one per cluster master."""

    def __init__(self, redis: aioredis.Redis | RedisCluster, scripts: Sequence[str] = ()) -> None:
        self._redis = redis
        self._scripts = list(scripts)
        self._plain: Wire | None = (
            None if isinstance(redis, RedisCluster) else Wire(redis, self._scripts)
        )
        self._nodes: dict[str, tuple[aioredis.Redis, Wire]] = {}

    @property
    def cluster(self) -> bool:
        return self._plain is None

    async def wire_for(self, key: str) -> tuple[str, Wire]:
        """The wire to the Redis serving ``key``, and that master's ``host:port`` ("" on one Redis)."""
        if self._plain is not None:
            return "", self._plain
        assert isinstance(self._redis, RedisCluster)
        node = await owner_node(self._redis, key)
        if node.name not in self._nodes:
            client = node_client(node)
            self._nodes[node.name] = (client, Wire(client, self._scripts))
        return node.name, self._nodes[node.name][1]

    async def client_for(self, key: str) -> aioredis.Redis:
        """The plain client of the Redis serving ``key`` (its pool gives a connection of its own to a
        caller that must hold one across round trips: a scheduled registration's ``WATCH``)."""
        if self._plain is not None:
            assert not isinstance(self._redis, RedisCluster)
            return self._redis
        node, _ = await self.wire_for(key)
        return self._nodes[node][0]

    async def forget(self) -> None:
        """After a redirect: drop the masters' wires and read the slot map again."""
        await self._close_nodes()
        assert isinstance(self._redis, RedisCluster)
        await self._redis.nodes_manager.initialize()

    async def close(self) -> None:
        """Give every connection back (the caller closes the client it was given)."""
        if self._plain is not None:
            await self._plain.close()
        await self._close_nodes()

    async def _close_nodes(self) -> None:
        nodes, self._nodes = self._nodes, {}
        for client, wire in nodes.values():
            await wire.close()
            await client.aclose()


class Sender:
    """What :class:`lbs.Producer` and :class:`lbs.Publisher` share: the service (in ``shards``), the
    largest registration they send and the consumers' judge of it, the Redis client (closed by
    :meth:`close` when lbs opened it from a URL), the routes to the Redis serving each shard, and
    the plugins (``plugins`` passed, and the installed ones unless ``load_entrypoint_plugins`` is
    False, as for :class:`lbs.Client`), asked once per send for fields to add to its entries
    (hook ``lbs_message_fields``)."""

    # Lua sources the routes' wires load after a NOSCRIPT.
    _scripts: ClassVar[Sequence[str]] = ()

    def __init__(
        self,
        redis: RedisLike,
        service: str,
        *,
        cluster: bool | ClusterMode = ClusterMode.NONE,
        shards: int = 1,
        max_input_bytes: int = 65_536,
        plugins: Iterable[object] = (),
        load_entrypoint_plugins: bool = True,
    ) -> None:
        self.service = _keys.validate_service(service)
        #: The plugin manager (hook ``lbs_message_fields``).
        self.pm = make_plugin_manager(plugins, load_entrypoints=load_entrypoint_plugins)
        self.shards = _keys.check_shards(shards)
        #: Largest registration (``lbs-input`` value, bytes) this sends.
        self.max_input_bytes = _keys.check_max_input_bytes(max_input_bytes)
        #: The service of each shard (one: ``service`` itself); see :mod:`lbs.sharding`.
        self.services = _keys.shard_services(service, shards)
        #: The LBS of each shard (one: ``<service>-input``).
        self.streams = [_keys.input_stream(svc) for svc in self.services]
        self.stream = self.streams[0]
        # The consumers' judge of an LBS entry (lbs.Client builds the same one): what it calls
        # malformed is refused here, so the two cannot drift apart.
        self._judge = EntryParser(_keys.INPUT_FIELD, max_input_bytes=max_input_bytes)
        self._redis, self._owned = resolve_client(redis, cluster=cluster)
        # Batches go over the core's Wire: on one Redis, one; on a cluster, one per master owning a
        # shard's slot, through a client of ours made on first use.
        self._routes = Routes(self._redis, self._scripts)

    def _message_fields(self) -> list[str]:
        """The fields plugins add to every entry of one send (hook ``lbs_message_fields``), flat;
        ``[]`` when no plugin implements the hook (the common case: one lookup per send)."""
        impls = self.pm.hook.lbs_message_fields.get_hookimpls()
        if not impls:
            return []
        kwargs = {"sender": self, "service": self.service}
        merged = merged_fields(impls, "lbs_message_fields", kwargs, log)
        return [x for kv in merged.items() for x in kv]

    async def _park_entries(
        self,
        service: str,
        entries: Sequence[Sequence[Any]],
        due: tuple[bool, int],
        operation: str,
    ) -> list[str]:
        """Park ``entries`` (each an entry's flat fields) due at ``due`` in ``service``'s parking
        stream, in one transaction (:mod:`lbs._schedule`); their parked ids. A redirect (the slot
        moved) or a demoted master ran nothing: sent once more. Raises RedisOperationError."""
        parked, due_key = _keys.delayed_stream(service), _keys.due_key(service)
        for attempt in range(2):
            try:
                client = await self._routes.client_for(parked)
                return await _schedule.park(client, parked, due_key, entries, due)
            except (RedisError, RedisClusterException, OSError, TypeError, ValueError) as exc:
                if attempt == 0 and (redirected(exc) or isinstance(exc, ReadOnlyError)):
                    try:
                        if self._routes.cluster:
                            await self._routes.forget()
                    except (RedisError, RedisClusterException) as again:
                        raise RedisOperationError(operation, again) from again
                    continue
                raise RedisOperationError(operation, exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Give the connections back; close the Redis client if lbs opened it from a URL."""
        await self._routes.close()
        if self._owned:
            await self._redis.aclose()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
