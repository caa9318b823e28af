"""Registering data streams in the load-balancer stream."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Union

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from _lbscore import CommandBatch, encode_input

from . import _keys
from ._connection import RedisLike, resolve_client, slot_owner
from ._wire import Wire
from .exceptions import RedisOperationError

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

    def __init__(self, redis: RedisLike, service: str, *, cluster: bool = False) -> None:
        self.service = _keys.validate_service(service)
        self.stream = _keys.input_stream(service)
        self._redis, self._owned = resolve_client(redis, cluster=cluster)
        # On a cluster, batches go to the slot owner through a client of ours, made on first use.
        self._node: aioredis.Redis | None = None
        self._wire: Wire | None = None if isinstance(self._redis, RedisCluster) else Wire(self._redis)

    async def _reroute(self) -> None:
        assert isinstance(self._redis, RedisCluster)
        if self._wire is not None:
            await self._wire.close()
        if self._node is not None:
            await self._node.aclose()
        self._node, self._wire = None, None
        await self._redis.nodes_manager.initialize()

    async def _batch_wire(self) -> Wire:
        if self._wire is None:
            assert isinstance(self._redis, RedisCluster)
            self._node, _ = await slot_owner(self._redis, self.stream)
            self._wire = Wire(self._node)
        return self._wire

    async def add_stream(self, name: str, info: Mapping[str, Any] | None = None) -> str:
        """Register data stream ``name``; return the LBS entry id.

        Raises :class:`lbs.InvalidInputError` if ``name`` is empty or ``info``
        cannot be encoded as a JSON object, :class:`lbs.RedisOperationError`
        if Redis fails.
        """
        payload = encode_input(name, dict(info) if info is not None else None)
        try:
            entry_id = await self._redis.xadd(self.stream, {_keys.INPUT_FIELD: payload})
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
        payloads = []
        for spec in streams:
            if isinstance(spec, str):
                name, info = spec, None
            else:
                name, info = spec
            payloads.append(encode_input(name, dict(info) if info is not None else None))
        if not payloads:
            return []
        stream, field = self.stream, _keys.INPUT_FIELD

        def build(b: CommandBatch) -> None:
            for payload in payloads:
                b.command("XADD", stream, "*", field, payload)

        try:
            ids = await (await self._batch_wire()).execute(build)
            if isinstance(self._redis, RedisCluster) and all(_redirected(r) for r in ids):
                # The whole batch met a node that no longer owns the slot, so none
                # of it ran: find the owner again and send it there, once.
                await self._reroute()
                ids = await (await self._batch_wire()).execute(build)
            for reply in ids:
                if isinstance(reply, Exception):
                    raise reply
        except RedisError as exc:
            # Some entries of the batch may have been added: XADD is not
            # idempotent before Redis 8.6's IDMP, so a retry can duplicate.
            raise RedisOperationError("add_streams", exc) from exc
        return [_as_str(i) for i in ids]

    async def close(self) -> None:
        """Give the batch connection back; close the Redis client if lbs opened it from a URL."""
        if self._wire is not None:
            await self._wire.close()
        if self._node is not None:
            await self._node.aclose()
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


def _redirected(reply: object) -> bool:
    """A reply saying the command ran nowhere because this node does not own the slot."""
    return isinstance(reply, ResponseError) and str(reply).split(" ", 1)[0] in ("MOVED", "ASK", "READONLY",
                                                                               "CLUSTERDOWN", "TRYAGAIN")
