"""Registering data streams in the load-balancer stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Union

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from _lbscore import CommandBatch, encode_input

from . import _keys
from ._connection import ClusterMode, RedisLike, node_client, owner_node, redirected, resolve_client
from ._wire import Wire
from .exceptions import RedisOperationError
from .sharding import shard_of, shard_services

#: One data stream to register: its name, or ``(name, info)``.
StreamSpec = Union[str, "tuple[str, Mapping[str, Any] | None]"]


class Producer:
    """Registers data streams in the LBS ``<service>-input`` for consumers to pick up.

    Each registration is one LBS entry whose field ``lbs-input`` holds
    ``{"DataStreamName": name, "Info": info}``, the Go client's wire format.
    ``redis`` is a ``redis.asyncio.Redis`` client (left open by :meth:`close`)
    or a URL (lbs opens the client and closes it). A batch is encoded by the
    compiled core and sent in one write on a connection of the client's pool,
    which :meth:`close` gives back.
    """

    def __init__(self, redis: RedisLike, service: str, *, cluster: bool | ClusterMode = ClusterMode.NONE,
                 shards: int = 1) -> None:
        self.service = _keys.validate_service(service)
        self.shards = shards
        #: The LBS of each shard (one: ``<service>-input``); see :mod:`lbs.sharding`.
        self.streams = [_keys.input_stream(svc) for svc in shard_services(service, shards)]
        self.stream = self.streams[0]
        self._redis, self._owned = resolve_client(redis, cluster=cluster)
        # Batches go over the core's Wire: on one Redis, one; on a cluster, one per
        # master owning a shard's slot, through a client of ours made on first use.
        self._plain_wire: Wire | None = None if isinstance(self._redis, RedisCluster) else Wire(self._redis)
        self._nodes: dict[str, tuple[aioredis.Redis, Wire]] = {}

    def _stream_for(self, name: str) -> str:
        return self.streams[shard_of(name, self.shards)] if self.shards > 1 else self.stream

    async def _wire_for(self, stream: str) -> tuple[str, Wire]:
        if self._plain_wire is not None:
            return "", self._plain_wire
        assert isinstance(self._redis, RedisCluster)
        node = await owner_node(self._redis, stream)
        if node.name not in self._nodes:
            client = node_client(node)
            self._nodes[node.name] = (client, Wire(client))
        return node.name, self._nodes[node.name][1]

    async def _forget_routes(self) -> None:
        for client, wire in self._nodes.values():
            await wire.close()
            await client.aclose()
        self._nodes = {}
        assert isinstance(self._redis, RedisCluster)
        await self._redis.nodes_manager.initialize()

    async def add_stream(self, name: str, info: Mapping[str, Any] | None = None) -> str:
        """Register data stream ``name``; return the LBS entry id.

        Raises :class:`lbs.InvalidInputError` if ``name`` is empty or ``info``
        cannot be encoded as a JSON object, :class:`lbs.RedisOperationError`
        if Redis fails.
        """
        payload = encode_input(name, dict(info) if info is not None else None)
        try:
            entry_id = await self._redis.xadd(self._stream_for(name), {_keys.INPUT_FIELD: payload})
        except RedisError as exc:
            raise RedisOperationError("add_stream", exc) from exc
        return _as_str(entry_id)

    async def add_streams(self, streams: Iterable[StreamSpec]) -> list[str]:
        """Register many data streams in one round trip; return their entry ids in order.

        Every payload is encoded before anything is sent, so a bad one
        raises :class:`lbs.InvalidInputError` and registers nothing. A Redis
        failure raises :class:`lbs.RedisOperationError`; part of the batch may
        then have been registered.
        """
        payloads: list[tuple[str, bytes]] = []  # (the shard's LBS, payload), in order
        for spec in streams:
            if isinstance(spec, str):
                name, info = spec, None
            else:
                name, info = spec
            payloads.append((self._stream_for(name),
                             encode_input(name, dict(info) if info is not None else None)))
        if not payloads:
            return []
        try:
            # One batch per connection: all of it on one Redis; per slot owner on a cluster.
            groups: dict[str, tuple[Wire, list[int]]] = {}
            for k, (stream, _) in enumerate(payloads):
                name, wire = await self._wire_for(stream)
                groups.setdefault(name, (wire, []))[1].append(k)
            ids: list[Any] = [None] * len(payloads)
            results = await asyncio.gather(*(self._send(wire, [payloads[k] for k in ks])
                                             for wire, ks in groups.values()))
            for (_, ks), replies in zip(groups.values(), results):
                for k, reply in zip(ks, replies):
                    ids[k] = reply
            if isinstance(self._redis, RedisCluster):
                # A batch whose every reply is a redirect met a node that no longer
                # owns its slot and ran nowhere: find the owners again, send it once more.
                stale = [k for _, ks in groups.values() if all(redirected(ids[k]) for k in ks) for k in ks]
                if stale:
                    await self._forget_routes()
                    for k in stale:
                        _, wire = await self._wire_for(payloads[k][0])
                        (ids[k],) = await self._send(wire, [payloads[k]])
            for reply in ids:
                if isinstance(reply, Exception):
                    raise reply
        except RedisError as exc:
            # Some entries of the batch may have been added: XADD is not
            # idempotent before Redis 8.6's IDMP, so a retry can duplicate.
            raise RedisOperationError("add_streams", exc) from exc
        return [_as_str(i) for i in ids]

    @staticmethod
    async def _send(wire: Wire, items: list[tuple[str, bytes]]) -> list[Any]:
        field = _keys.INPUT_FIELD

        def build(b: CommandBatch) -> None:
            for stream, payload in items:
                b.command("XADD", stream, "*", field, payload)

        return await wire.execute(build)

    async def close(self) -> None:
        """Give the batch connection back; close the Redis client if lbs opened it from a URL."""
        if self._plain_wire is not None:
            await self._plain_wire.close()
        for client, wire in self._nodes.values():
            await wire.close()
            await client.aclose()
        self._nodes = {}
        if self._owned:
            await self._redis.aclose()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _as_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value

