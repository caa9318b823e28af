"""A sharded LBS: one service spread over several load-balancer streams.

One LBS lives in one hash slot (every key of a service shares its tag), so
one service's throughput is capped by one master. With ``shards=N`` a
service has N LBS streams with distinct tags, which Redis Cluster spreads
over its masters:

* shard ``i`` of ``N`` of service ``s`` is the service ``s.i`` or ``s.i~j``, named so that its
  hash slot lies in the middle of the ``i``-th of N equal slot ranges (:mod:`lbs._placement`):
  masters owning equal ranges each carry N / M shards, whatever the service's name. With one
  shard it is ``s`` itself, the unsharded wire format. Each shard has its own leases, pending
  list, deadline index and dead-letter stream, all under its own tag;
* a producer sends a data stream to shard ``crc32(name) % N``, so the same
  name always lands in the same shard (and any client, in any language, can
  compute it);
* a consumer (:class:`ShardedClient`) runs one :class:`lbs.Client` per shard
  (reader, heartbeat, recovery each) and merges their notifications.

A shard's name depends on N. Changing N loses nothing if done in this order: start consumers with
``shards=new, previous_shards=[old]`` (``lbs worker --shards new --previous-shards old``), so
every shard that can hold work is read; switch the producers to the new N; once the old layout's
shards are empty (``lbs status``: XLEN and XPENDING 0), restart the consumers without
``previous_shards`` and delete the old shards' keys. While both layouts hold work, one data
stream's assignments may sit in two shards at once. Upgrading from an lbs that named every shard
``s.i``: consumers first (they read the shards of the earlier names that a producer wrote to, and say
so), then producers; then delete the earlier shards' keys once empty.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

from redis.exceptions import RedisError, ResponseError

from . import _keys
from ._consumer.slots import SharedSlots
from ._keys import check_shards, shard_of, shard_services
from ._redis.connection import ClusterMode, RedisLike, resolve_client
from ._redis.wire import text
from .client import Client, Handler
from .config import Config
from .exceptions import NotHeldError, RedisOperationError
from .keyed import KeyedHandler
from .notifications import DoneStatus, Notification
from .status.shards import legacy_candidates

__all__ = ["ShardedClient", "producer_wrote", "shard_of", "shard_services"]

log = logging.getLogger("lbs.sharding")


class ShardedClient:
    """A consumer of every shard of a sharded service: one :class:`lbs.Client` per shard.

    ``max_streams`` of ``config`` (or :meth:`run`'s ``concurrency``) is the process's: the shards'
    clients share it (:mod:`lbs._consumer.slots`), so each read asks for what the whole process has
    free, in whichever shard the work is. ``Config.rate_limit`` is the service's: each shard takes a
    N-th of it (a legacy shard read during a migration another N-th). Notifications of all shards
    come through :meth:`notifications`; :meth:`done_stream` finds the shard holding the stream.
    Plugins are registered in every shard's client. ``previous_shards``: the shard counts of layouts
    being left (a change of N); their shards, and those an earlier lbs named otherwise, are read too
    where a producer wrote to their LBS (found at start).
    """

    def __init__(
        self,
        redis: RedisLike,
        service: str,
        consumer_id: str | None = None,
        config: Config | None = None,
        *,
        shards: int,
        previous_shards: Iterable[int] = (),
        plugins: Iterable[object] = (),
        load_entrypoint_plugins: bool = True,
        cluster: bool | ClusterMode = ClusterMode.NONE,
    ) -> None:
        self.service = service
        self.shards = check_shards(shards)
        previous = [check_shards(n) for n in previous_shards]
        self._redis, self._owned = resolve_client(redis, cluster=cluster)
        cfg = config if config is not None else Config()
        if cfg.rate_limit is not None:
            # Each shard counts its own windows (their keys in its slot): a N-th of the limit each,
            # so the shards together take at most the service's (their loads are even: crc32).
            cfg = replace(cfg, rate_limit=cfg.rate_limit / self.shards)
        self._slots = SharedSlots()
        plugins = list(plugins)
        self._args = (consumer_id, cfg, plugins, load_entrypoint_plugins)
        # From a URL each shard's client opens its own (a pool of its own: one shared pool of
        # redis-py's default 100 connections runs out at about 16 shards, six connections each).
        self._shared = redis if not isinstance(redis, str) else None
        self._url = redis if isinstance(redis, str) else ""
        self._cluster = cluster
        #: One :class:`lbs.Client` per shard, in shard order, then one per legacy shard found at start.
        self.clients = [self._client(svc) for svc in shard_services(service, self.shards)]
        self._merged: asyncio.Queue[Notification | None] = asyncio.Queue()
        self._pumps: list[asyncio.Task[None]] = []
        # Read too where a producer wrote to their LBS: shards an earlier lbs named otherwise
        # (lbs._placement), and those of the layouts being left (previous_shards).
        self._legacy = [c[0] for c in legacy_candidates(service, self.shards, tuple(previous))]
        self._looked = False

    @property
    def held(self) -> int:
        """How many data streams the shards' clients hold now, together."""
        return sum(c.held for c in self.clients)

    async def start(self) -> None:
        """Start every shard's client (:meth:`lbs.Client.start`)."""
        await self._add_legacy()
        await asyncio.gather(*(c.start() for c in self.clients))

    async def _add_legacy(self) -> None:
        """A client for each legacy shard whose LBS exists (what producers of an earlier lbs wrote
        there is served: see :mod:`lbs._placement`), once."""
        if self._looked or not self._legacy:
            return
        self._looked = True
        found = [svc for svc in self._legacy if await producer_wrote(self._redis, svc)]
        for svc in found:
            log.warning(
                "%s: the shard %s (named by an earlier lbs) still exists: reading it too. Once every "
                "producer runs this lbs and it is empty (lbs status %s), delete its keys: "
                "%s and {%s}:*",
                self.service,
                svc,
                svc,
                _keys.input_stream(svc),
                _keys.input_stream(svc),
            )
            self.clients.append(self._client(svc))

    def _client(self, svc: str) -> Client:
        consumer_id, cfg, plugins, load = self._args
        return Client(
            self._shared if self._shared is not None else self._url,
            svc,
            consumer_id,
            cfg,
            plugins=plugins,
            load_entrypoint_plugins=load,
            cluster=self._cluster if self._shared is None else ClusterMode.NONE,
            _slots=self._slots,
        )

    async def _pump(self, c: Client) -> None:
        async for note in c.notifications():
            await self._merged.put(note)
        await self._merged.put(None)

    async def notifications(self) -> AsyncIterator[Notification]:
        """Every shard's notifications, as they come; ends when every shard's client is closed."""
        if not self._pumps:
            self._pumps = [asyncio.create_task(self._pump(c)) for c in self.clients]
        ended = 0
        while ended < len(self.clients):
            note = await self._merged.get()
            if note is None:
                ended += 1
                continue
            yield note

    def _holder(self, stream: str, entry_id: str | None) -> Client:
        first = shard_of(stream, self.shards)
        for c in [self.clients[first], *self.clients[:first], *self.clients[first + 1 :]]:
            if c.find_held(stream, entry_id) is not None:
                return c
        raise NotHeldError(f"data stream {stream!r} is not held by any shard of {self.service!r}")

    async def done_stream(self, stream: str, entry_id: str | None = None) -> DoneStatus:
        """Finish a held data stream in whichever shard holds it (see :meth:`lbs.Client.done_stream`)."""
        return await self._holder(stream, entry_id).done_stream(stream, entry_id)

    async def run(self, handler: Handler | None = None, concurrency: int | None = None) -> None:
        """:meth:`lbs.Client.run` on every shard; returns once all are closed."""
        await self._add_legacy()
        await asyncio.gather(*(c.run(handler, concurrency) for c in self.clients))

    async def run_keyed(
        self, handler: KeyedHandler, concurrency: int | None = None, **options: Any
    ) -> None:
        """:meth:`lbs.Client.run_keyed` on every shard (``options`` as there); returns once all are closed.

        Publish with ``lbs.Publisher(..., shards=N)``: a key's messages go to its shard."""
        await self._add_legacy()
        await asyncio.gather(*(c.run_keyed(handler, concurrency, **options) for c in self.clients))

    async def close(self) -> None:
        """Close every shard's client (each hands its streams back); then the Redis client, if lbs opened it."""
        await asyncio.gather(*(c.close() for c in self.clients))
        for pump in self._pumps:
            await pump
        self._pumps = []
        if self._owned:
            await self._redis.aclose()

    async def __aenter__(self) -> ShardedClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


async def producer_wrote(redis: Any, svc: str) -> bool:
    """Whether a producer ever wrote to the shard ``svc``'s LBS (``entries-added`` of XINFO STREAM),
    what makes a legacy shard worth reading (or pausing): one that a consumer recreated, empty, when
    its keys were deleted under it (a reader recreates a group that vanished, with its stream) is
    not, so deleting it once every consumer runs this lbs is for good."""
    try:
        info = await redis.xinfo_stream(_keys.input_stream(svc))
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return False
        raise RedisOperationError(f"look for the legacy shard {svc}", exc) from exc
    except RedisError as exc:
        raise RedisOperationError(f"look for the legacy shard {svc}", exc) from exc
    added = {text(k): v for k, v in info.items()}.get("entries-added")
    return int(added or 0) > 0
