"""Which Redis serves the service, and what it is: routing on a cluster, the group, the server's features.

On Redis Cluster every command goes to the master owning the LBS's slot,
through a plain client of ours (see lbs._redis.connection); a failure that
may mean the slot moved (a redirect, a refused or dropped connection) makes
:meth:`Topology.after_failure` look again, and a move rebuilds
``state.link`` whole. The keyspace listener notices the new link and
resubscribes there.

Also here: the consumer group (created if missing), the server's version and
run id (a change means a restart), and ``notify-keyspace-events``, which
recovery's listener needs and a restart forgets.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from .._redis.connection import (
    ensure_group,
    first_node_client,
    parse_version,
    server_name,
    skipped_entries,
    slot_owner,
    topology_error,
)
from .._redis.wire import text
from ..exceptions import RedisOperationError
from .state import ClientState, Link

__all__ = ["KEYSPACE_FLAGS", "Topology"]

#: Keyspace-event flags recovery needs: K (keyspace channel) and x (expired keys).
# Not g (generic commands, del among them): with it, every name released by
# done_stream (its holder key deleted) would also publish a del event to every
# listener of the service (one message per finished stream).
KEYSPACE_FLAGS = "Kx"


class Topology:
    """Routing, the group and the server's features, for one client."""

    def __init__(self, state: ClientState, cluster: RedisCluster | None) -> None:
        self.state = state
        self.cluster = cluster
        self._lock = asyncio.Lock()
        #: Whether ``notify-keyspace-events`` has the flags recovery needs (set or found).
        self.keyspace_events_configured = False
        self._keyspace_wanted = False  # once started with Config.configure_keyspace_events

    @staticmethod
    def first_link(source: aioredis.Redis | RedisCluster) -> Link:
        """The link before routing: the plain client, or on a cluster its first startup node."""
        if isinstance(source, RedisCluster):
            return Link(first_node_client(source))
        return Link(source)

    async def start(self) -> None:
        """Route, create the group if needed, read the server's features; a few tries on a moving cluster."""
        cfg = self.state.config
        for attempt in range(5):
            try:
                await self._route(refresh=attempt > 0)
                await self.ensure_group()
                await self._read_server()
                await self.check_eviction()
                return
            except RedisError as exc:
                if self.cluster is None or not topology_error(exc) or attempt == 4:
                    raise RedisOperationError("start", exc) from exc
                await asyncio.sleep(cfg.read_retry_initial * 2**attempt)

    async def ensure_group(self) -> None:
        """Create the group at 0 unless it exists; if it does, warn about entries it skips."""
        s = self.state
        if await ensure_group(s.link.redis, s.names.stream_key, s.names.group):
            return
        try:
            n, last, more = await skipped_entries(s.link.redis, s.names.service)
        except RedisError as exc:  # advisory: never what stops a start
            if not s.denied(exc, "counting the entries the group skips"):
                s.log.debug("cannot count the entries the group skips: %s", exc)
            return
        if n:
            s.log.warning(
                "%s%d entries of %s are at or before group %s's last-delivered id %s and not pending: no "
                "consumer will ever read them (the group was created at $ after they were added, as the Go "
                "client v0.4 does). Fix: with every consumer stopped, XGROUP SETID %s %s 0; start an lbs "
                "consumer first next time (it creates the group at 0)",
                "at least " if more else "",
                n,
                s.names.stream_key,
                s.names.group,
                last,
                s.names.stream_key,
                s.names.group,
            )

    async def _route(self, refresh: bool = False) -> bool:
        """On a cluster: bind to the master that owns the LBS's slot; whether it changed."""
        if self.cluster is None:
            return False
        s = self.state
        owner, name = await slot_owner(self.cluster, s.names.stream_key, refresh=refresh)
        old = s.link
        if name == old.node:
            await owner.aclose()
            return False
        s.link = Link(owner, name)
        if old.node:
            s.hooks.metric("topology_changes_total", 1)
            s.log.warning("the slot of %s moved from %s to %s", s.names.stream_key, old.node, name)
        else:
            s.log.info("routed to %s, the master owning the slot of %s", name, s.names.stream_key)
        await old.close(s.log)
        try:
            await old.redis.aclose()
        except Exception as exc:
            s.log.debug("closing the client of the old owner: %s", exc)
        return True

    async def reset(self) -> bool:
        """Find the slot's owner again and move there if it changed (see :meth:`lbs.Client.reset_topology`)."""
        if self.cluster is None:
            return False
        async with self._lock:
            if not await self._route(refresh=True):
                return False
            if self._keyspace_wanted:
                await self.configure_keyspace_events()
            return True

    async def after_failure(self, exc: BaseException) -> None:
        """On a cluster, a failure that may mean the slot moved triggers :meth:`reset`."""
        if self.cluster is None or not topology_error(exc):
            return
        try:
            await self.reset()
        except Exception as again:  # the cluster may still be electing: the next failure retries
            self.state.log.warning(
                "cannot resolve the slot owner of %s yet (%s)", self.state.names.stream_key, again
            )

    async def _read_server(self) -> str:
        info = await self.state.link.redis.info("server")
        server = self.state.server
        server.version = parse_version(info.get("redis_version", "0"))
        product, own = server_name(info)
        server.name = f"{product} {own}"
        server.valkey = parse_version(own) if product == "Valkey" else ()
        before, server.run_id = server.run_id, str(info.get("run_id", ""))
        return before

    async def check_eviction(self) -> None:
        """Warn when the server's ``maxmemory-policy`` may evict lbs's own keys (read from ``INFO memory``,
        which managed services leave open where they block ``CONFIG``)."""
        s = self.state
        try:
            info = await s.link.redis.info("memory")
        except RedisError as exc:  # advisory: never what stops a start
            if not s.denied(exc, "reading the server's maxmemory-policy"):
                s.log.debug("cannot read the server's maxmemory-policy: %s", exc)
            return
        policy = text(info.get("maxmemory_policy", ""))
        if policy.startswith("allkeys-"):
            s.log.warning(
                "the server's maxmemory-policy is %s: when memory is full Redis may evict the LBS "
                "itself (registered work is lost), the dead-letter stream, the deadline index or the "
                "fencing counter. Give lbs a Redis of its own with maxmemory-policy noeviction (see "
                "'Persistence and eviction' in docs/operations.md)",
                policy,
            )
        elif policy.startswith("volatile-"):
            s.log.info(
                "the server's maxmemory-policy is %s: when memory is full Redis may evict live "
                "consumers' leases (their streams are disowned and put back, nothing is lost); "
                "noeviction is the safe policy",
                policy,
            )

    async def check_server(self) -> bool:
        """Notice a server restart (its run id changed) and re-apply what it forgot; whether it restarted."""
        s = self.state
        before = await self._read_server()
        if before == s.server.run_id:
            return False
        s.hooks.metric("server_restarts_total", 1)
        again = s.config.configure_keyspace_events
        s.log.warning(
            "the server restarted or failed over (run id %s -> %s)%s",
            before[:8],
            s.server.run_id[:8],
            "; setting notify-keyspace-events again" if again else "",
        )
        if again:
            await self.configure_keyspace_events()
        return True

    async def keep_keyspace_events(self) -> None:
        """At start, with ``Config.configure_keyspace_events``: configure them now, and again after a move."""
        self._keyspace_wanted = True
        await self.configure_keyspace_events()

    async def configure_keyspace_events(self) -> None:
        """Add the flags recovery needs to ``notify-keyspace-events`` (a warning if the server refuses)."""
        r = self.state.link.redis
        try:
            reply = await r.config_get("notify-keyspace-events")
            current = text(next(iter(reply.values()), b"")) if reply else ""
            have = set(current)
            if "A" in have:
                have |= set("g$lshzxetd")
            missing = "".join(f for f in KEYSPACE_FLAGS if f not in have)
            if missing:
                await r.config_set("notify-keyspace-events", current + missing)
            self.keyspace_events_configured = True
        except RedisError as exc:
            self.state.log.warning(
                "cannot configure notify-keyspace-events (%s); set it to include %r out of band. "
                "Recovery falls back to its other paths.",
                exc,
                KEYSPACE_FLAGS,
            )
