"""The consumer: assignment, fenced locks, one batched heartbeat, done, hand-back.

Three tasks run per client, whatever the number of held streams:

* the **reader** reads the LBS with ``XREADGROUP ... >`` up to the free
  capacity, parses the batch in the compiled core, takes every lock of the
  batch (and dead-letters malformed entries) in one round trip, and sends
  STREAM_ADDED notifications;
* the **heartbeat** extends every held lock and refreshes the pending idle
  time of their entries, one round trip per tick;
* ``run()`` (optional) turns notifications into handler calls.

State: ``_held`` is the core's :class:`HeldTable` of :class:`Held` records,
by entry id and by data stream name.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from types import CoroutineType, TracebackType
from typing import Any

import pluggy
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from _lbscore import CommandBatch, Entry, EntryParser, Held, HeldTable, Shape

from . import _keys
from ._connection import (ClusterMode, RedisLike, cancel_and_wait, execute, first_node_client, parse_version,
                          redirected, resolve_client, slot_owner)
from ._eager import start_task
from ._scripts import DoneCode, RequeueCode, Scripts
from ._wire import Wire
from .config import Config
from .exceptions import ConfigurationError, InterfaceError, NotHeldError, RedisOperationError
from .notifications import DoneStatus, Mailbox, Notification, NotificationType
from .plugins import make_plugin_manager, plugin_config_defaults
from .deadletters import Forwarder
from .reading import ReadStrategy
from .recovery import Recovery

__all__ = ["Client", "Held", "consumer_id_from_env"]

log = logging.getLogger("lbs.client")

CONSUMER_PREFIX = "redis-consumer-"
#: Keyspace-event flags recovery needs: K (keyspace channel) and x (expired keys).
# Not g (generic commands, del among them): with it, every lock released by
# done_stream would also publish a del event to every listener of the service
# (one message per finished stream).
KEYSPACE_FLAGS = "Kx"
#: How many recently disowned streams ``done_stream`` still recognises.
TOMBSTONES = 10_000
#: Most done_stream calls the finisher finishes in one script call.
DONE_BATCH = 1_000
# done-n.lua's codes (DoneCode) as the statuses done_stream reports; anything else is a lost lock.
# ALREADY_DONE: a retried call whose first reply was lost found its own work finished.
_DONE_STATUS = {int(DoneCode.DONE): DoneStatus.DONE, int(DoneCode.LOCK_EXPIRED): DoneStatus.LOCK_EXPIRED,
                int(DoneCode.ALREADY_DONE): DoneStatus.DONE}

Handler = Callable[[Notification], Awaitable[Any]]


def consumer_id_from_env(explicit: str | None = None) -> str:
    """The consumer id: ``explicit``, else ``$POD_NAME``, else ``$POD_IP``,
    prefixed ``redis-consumer-`` (the Go client's rule)."""
    if explicit is not None and not isinstance(explicit, str):
        raise ConfigurationError(f"consumer_id must be a str, got {type(explicit).__name__}")
    raw = explicit or os.environ.get("POD_NAME") or os.environ.get("POD_IP")
    if not raw:
        raise ConfigurationError(
            "no consumer id: pass consumer_id=..., or set POD_NAME or POD_IP in the environment"
        )
    if any(c.isspace() for c in raw):
        raise ConfigurationError(f"consumer id must not contain whitespace: {raw!r}")
    return raw if raw.startswith(CONSUMER_PREFIX) else CONSUMER_PREFIX + raw


@dataclass(slots=True)
class ClientStats:
    """What a client did since it started: plain counters, updated as it goes."""

    #: Streams taken (locked and handed to the application).
    taken: int = 0
    #: Streams finished (``done_stream`` or a returning ``run()`` handler), whatever the outcome.
    finished: int = 0
    #: ... of which with the lock still ours (``DoneStatus.DONE``).
    done: int = 0
    #: ... of which after the lock expired, nobody else having the stream (``LOCK_EXPIRED``).
    lock_expired: int = 0
    #: ... of which after the stream was handed on (``LOCK_LOST``).
    lock_lost: int = 0


class _Log(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Puts the consumer id in every record (message prefix and ``record.consumer_id``)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        kwargs.setdefault("extra", {}).update(extra)
        return f"[{extra.get('consumer_id')}] {msg}", kwargs


class Client:
    """A consumer of the service's load-balancer stream.

    ::

        client = lbs.Client("redis://...", "orders", consumer_id="worker-1")
        await client.start()
        async for note in client.notifications():
            if note.type is lbs.NotificationType.STREAM_ADDED:
                ...  # process note.stream
                await client.done_stream(note.stream)

    or let :meth:`run` call a handler per stream. ``redis`` is a
    ``redis.asyncio.Redis`` client (left open) or a URL (opened and closed by
    the client). Use ``async with`` or call :meth:`close`, which hands every
    held stream back at once.
    """

    def __init__(
        self,
        redis: RedisLike,
        service: str,
        consumer_id: str | None = None,
        config: Config | None = None,
        *,
        plugins: Iterable[object] = (),
        load_entrypoint_plugins: bool = True,
        cluster: bool | ClusterMode = ClusterMode.NONE,
    ) -> None:
        self.service = _keys.validate_service(service)
        if config is not None and not isinstance(config, Config):
            raise ConfigurationError(f"config must be an lbs.Config, got {type(config).__name__}")
        self.pm: pluggy.PluginManager = make_plugin_manager(
            plugins, load_entrypoints=load_entrypoint_plugins,
            disabled=config.disabled_plugins if config is not None else ())
        # Without an explicit Config, plugins may contribute defaults (hook lbs_config_defaults).
        self.config = config if config is not None else Config(**plugin_config_defaults(self.pm))
        self.id = consumer_id_from_env(consumer_id)
        #: This process's instance nonce: lock values are "<token>:<id>:<instance>", so a
        #: process adopts only its own locks, and a second live process with the same
        #: consumer id is refused at start (the marker ``{<service>-input}:instance:<id>``).
        self.instance = uuid.uuid4().hex[:12]
        self.lock_owner = f"{self.id}:{self.instance}"
        self.instance_key = _keys.instance_key(service, self.id)
        self.stream_key = _keys.input_stream(service)
        self.group = _keys.group_name(service)
        self.fence_key = _keys.fence_key(service)
        self.consumers_key = _keys.consumers_key(service)
        dlq = self.config.dead_letter_stream
        self.dead_letter_key = _keys.dead_letter_stream(service) if dlq is None else dlq
        source, self._owned = resolve_client(redis, cluster=cluster)
        # On Redis Cluster every command goes to the master owning the LBS's
        # slot, through a plain client of ours (see _connection.py); start()
        # routes it there.
        self._cluster: RedisCluster | None = source if isinstance(source, RedisCluster) else None
        self.node = ""  # host:port of the slot owner, once routed (cluster only)
        self._lock_key_prefix = _keys.lock_key(service, "")  # + entry id: the lock key, without re-formatting
        self._lock_prefix = self._lock_key_prefix.encode()
        self._bind(first_node_client(self._cluster) if self._cluster is not None else source)  # type: ignore[arg-type]
        prefix = self.config.field_prefix
        self.retry_field = prefix + "retry_count"
        self.original_field = prefix + "original_id"
        self._parser = EntryParser(_keys.INPUT_FIELD, self.retry_field, self.original_field,
                                   self.config.max_input_bytes)
        self.log = _Log(log, {"consumer_id": self.id})
        self._trace_hooks = os.environ.get("LBS_TRACE_PLUGINS") == "1"

        self._held = HeldTable(self.lock_owner, self._lock_key_prefix)
        self._overdue_warned: set[str] = set()  # entry ids reported as held past hold_warning
        self._overdue_next = 0.0  # when the heartbeat looks for them again (monotonic)
        self._undead: list[tuple[Entry, str, str]] = []  # dead letters that could not be written yet
        self._beats = 0  # heartbeat ticks so far: picks which entries refresh their pending idle time
        self._tombstones: OrderedDict[str, Held] = OrderedDict()
        self._mailbox: Mailbox[Notification] = Mailbox(self.config.notification_buffer)
        self._capacity = asyncio.Event()
        self._stopping = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self._read_conn: Any = None  # the reader's own pooled connection (see _wait_for_entries)
        self._reply_lost = False  # a read's reply was lost: re-read our pending entries
        self._reader_client_id: int | None = None
        self._reading = False
        self._done_queue: list[tuple[Held, asyncio.Future[Any] | None]] = []
        self._done_inflight: list[tuple[Held, asyncio.Future[Any] | None]] = []  # the batch Redis runs now
        self._done_retry: list[tuple[Held, asyncio.Future[Any] | None]] = []  # batches Redis did not answer
        self._done_wakeup = asyncio.Event()
        self._done_idle = asyncio.Event()
        self._done_idle.set()
        self._dispatch: Callable[[Held, Notification], None] | None = None  # set by run()
        self._run_limit = 0  # run()'s concurrency, when below max_streams
        self._finished_event = asyncio.Event()
        #: Counters of what this client did (cheap, always on).
        self.stats = ClientStats()
        self._finisher: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False
        self._closing: asyncio.Future[None] | None = None  # the one shutdown every close() waits for
        self._drain_cut = asyncio.Event()  # a second signal: stop waiting for handlers
        self._use_xackdel = False
        self._forwarder: Forwarder | None = None  # dead letters to a plugin's backend
        self._topology_lock = asyncio.Lock()
        self._topology_epoch = 0  # bumped when the slot owner changed; the keyspace listener follows
        #: How this client reads new work (hook ``lbs_reader``; set by :meth:`start`).
        self.read_strategy = ReadStrategy(name="default")
        self._claim_arg = ""  # read-3.lua's CLAIM min-idle (ms), "" for none
        self.server_version: tuple[int, ...] = ()
        self._run_id = ""  # the server's run id at start: a change means it restarted
        self.keyspace_events_configured = False
        #: The recovery tasks (deadline poller, keyspace listener, scan); see lbs.recovery.
        self.recovery = Recovery(self)

    # ----------------------------------------------------------- plumbing ---

    def _listening(self, hook: str) -> bool:
        """True when some plugin implements ``hook`` (hot paths ask once per batch)."""
        return bool(getattr(self.pm.hook, hook).get_hookimpls())

    def _bind(self, redis: aioredis.Redis) -> None:
        """Use ``redis`` for everything: scripts, and the core's own connections for
        the batched hot paths (the reader's read-and-lock, the finisher, the heartbeat)."""
        self._redis = redis
        self._scripts = Scripts(redis)
        sources = self._scripts.sources()
        self._read_wire = Wire(redis, sources)
        self._done_wire = Wire(redis, sources)
        self._beat_wire = Wire(redis, sources)

    async def _route(self, refresh: bool = False) -> bool:
        """On a cluster: bind to the master that owns the LBS's slot; whether it changed."""
        if self._cluster is None:
            return False
        owner, name = await slot_owner(self._cluster, self.stream_key, refresh=refresh)
        if name == self.node:
            await owner.aclose()
            return False
        old_redis, old_wires = self._redis, (self._read_wire, self._done_wire, self._beat_wire)
        self._bind(owner)
        before, self.node = self.node, name
        self._read_conn = None  # the reader's blocking connection belonged to the old owner's pool
        self._reader_client_id = None
        if before:
            self._topology_epoch += 1  # the keyspace listener follows
            self.recovery._metric("topology_changes_total", "counter", 1)
            self.log.warning("the slot of %s moved from %s to %s", self.stream_key, before, name)
        else:
            self.log.info("routed to %s, the master owning the slot of %s", name, self.stream_key)
        for closing in (*(w.close() for w in old_wires), old_redis.aclose()):
            try:
                await closing  # connections may be mid-command in other tasks: best effort
            except Exception as exc:
                self.log.debug("closing a connection to the old owner: %s", exc)
        return True

    async def reset_topology(self) -> bool:
        """Find the master that owns the LBS's slot again, and move there if it changed.

        For a failover or a slot migration on Redis Cluster; returns whether
        the client moved. lbs calls it itself when a command is redirected
        (MOVED, ASK), refused by a replica (READONLY), the cluster is down,
        or a connection to the owner fails; the application may call it at
        any time. The keyspace listener resubscribes on the new owner, and
        until it is back the deadline poller and the scan cover. A no-op
        without a cluster.
        """
        if self._cluster is None:
            return False
        async with self._topology_lock:
            if not await self._route(refresh=True):
                return False
            if self._started and self.config.configure_keyspace_events:
                await self._configure_keyspace_events()
            return True

    async def _after_failure(self, exc: BaseException) -> None:
        """On a cluster, a failure that may mean the slot moved triggers :meth:`reset_topology`."""
        if self._cluster is None or not _topology_error(exc):
            return
        try:
            await self.reset_topology()
        except Exception as again:  # the cluster may still be electing: the next failure retries
            self.log.warning("cannot resolve the slot owner of %s yet (%s)", self.stream_key, again)

    def _hook(self, hook: str, /, **kwargs: Any) -> None:
        """Call every implementation of a 1:N hook, each on its own.

        pluggy stops a hook call at the first implementation that raises;
        here one plugin's bug is logged with its name and every other plugin
        still hears the event, and the client goes on.
        """
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        if not impls:
            return  # the common case on the hot path: nobody listens
        kwargs["client"] = self
        if self._trace_hooks:
            self.log.debug("hook %s(%s) -> %s", hook, ", ".join(kwargs), [i.plugin_name for i in impls])
        for impl in reversed(impls):  # pluggy's order (tryfirst/trylast kept): the last registered first
            if impl.hookwrapper or impl.wrapper:
                continue  # notifications have no result to wrap
            try:
                impl.function(*[kwargs[name] for name in impl.argnames])
            except Exception:
                self.log.exception("plugin %r raised in hook %s; ignored", impl.plugin_name, hook)

    @property
    def held(self) -> int:
        """How many data streams this client holds now."""
        return len(self._held)

    def held_streams(self) -> list[Held]:
        """The held streams (a snapshot)."""
        return self._held.values()

    def _drop_held(self, h: Held) -> bool:
        """Forget ``h``; False if it was not (or no longer) held."""
        if not self._held.drop(h):
            return False
        self._capacity.set()
        return True

    def _tombstone(self, h: Held) -> None:
        self._tombstones[h.stream] = h
        self._tombstones.move_to_end(h.stream)
        while len(self._tombstones) > TOMBSTONES:
            self._tombstones.popitem(last=False)

    # ------------------------------------------------------------- start ---

    async def start(self) -> None:
        """Create the group if needed, configure keyspace events, start reading.

        Idempotent. Raises :class:`lbs.RedisOperationError` if Redis is unreachable.
        """
        if self._started:
            return
        if self._closed:
            raise ConfigurationError("a closed client cannot be started again")
        for attempt in range(5):
            try:
                await self._route(refresh=attempt > 0)
                await self._ensure_group()
                await self._detect_features()
                break
            except RedisError as exc:
                # A cluster mid-failover or mid-migration: find the owner again, a few times.
                if self._cluster is None or not _topology_error(exc) or attempt == 4:
                    raise RedisOperationError("start", exc) from exc
                await asyncio.sleep(self.config.read_retry_initial * 2 ** attempt)
        await self._claim_instance()
        # Which reader: a plugin may answer (and may refuse this server by raising).
        strategy = self.pm.hook.lbs_reader(client=self, server_version=self.server_version)
        self.read_strategy = strategy if strategy is not None else ReadStrategy(name="default")
        claim_ms = self.read_strategy.claim_min_idle_ms
        self._claim_arg = "" if claim_ms is None else str(claim_ms)
        backend = self.pm.hook.lbs_dead_letter_backend(client=self) if self.dead_letter_key else None
        self._forwarder = Forwarder(self, backend) if backend is not None else None
        if self.config.configure_keyspace_events:
            await self._configure_keyspace_events()
        if self.config.recovery:
            try:
                await self.recovery.startup()
            except RedisError as exc:
                self.log.warning("startup recovery failed (%s); the scan will cover it", exc)
        self._started = True
        self._reader = asyncio.create_task(self._read_loop(), name=f"lbs-reader-{self.id}")
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name=f"lbs-heartbeat-{self.id}")
        if self.config.recovery:
            self.recovery.start()
        if self._forwarder is not None:
            self._forwarder.start()
        self.log.info("started on %s (group %s, Redis %s)", self.stream_key, self.group,
                      ".".join(map(str, self.server_version)) or "?")
        self._hook("lbs_client_started")

    async def _claim_instance(self) -> None:
        """Take this consumer id's instance marker, or refuse a second live process with the same id.

        The marker holds the running process's nonce with the lock TTL and
        every heartbeat tick refreshes it. When it is taken, either its
        process died moments ago (the marker then expires within the TTL and
        this start goes on) or it is alive (the marker is refreshed, and this
        start is refused): two processes under one consumer id share a
        pending list and a deadline, and would adopt each other's locks.
        """
        r, key, ttl_ms = self._redis, self.instance_key, self.config.lock_ttl_ms
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.config.lock_ttl + self.config.heartbeat_every + 1.0
        seen: tuple[Any, int] | None = None
        try:
            while not await r.set(key, self.instance, nx=True, px=ttl_ms):
                pipe = r.pipeline(transaction=True)
                pipe.get(key)
                pipe.pttl(key)
                holder, pttl = await execute(pipe)
                if holder is None:
                    continue  # expired between the two calls
                if seen is None:
                    self.log.warning("consumer id %s is marked in use by instance %s (%s); waiting up to %.1fs "
                                     "for that process's marker to expire", self.id, _text(holder), key,
                                     pttl / 1000)
                elif holder != seen[0] or pttl > seen[1]:
                    raise ConfigurationError(
                        f"consumer id {self.id!r} is in use by another live process (instance "
                        f"{_text(holder)}, marker {key}): give each process its own consumer id "
                        "(POD_NAME or consumer_id=...)")
                if loop.time() > give_up:
                    raise ConfigurationError(
                        f"consumer id {self.id!r} stays marked in use by instance {_text(holder)} ({key}, "
                        f"ttl {pttl} ms): another process runs with it, or the key was set by hand")
                seen = (holder, pttl)
                await asyncio.sleep(min(0.1, self.config.heartbeat_every / 4))
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise RedisOperationError("start", ResponseError(
                f"{key} holds a value of the wrong type, not this consumer's instance marker: {exc}")) from exc

    async def _release_instance(self) -> None:
        """Delete the instance marker if still ours, so a restart under this id need not wait for it."""
        try:
            await self._scripts.leave(keys=[self.instance_key], args=[self.instance])
        except RedisError as exc:
            self.log.debug("could not delete the instance marker %s (%s); it expires", self.instance_key, exc)

    async def _ensure_group(self) -> None:
        # Id 0, not $: assignments added before any consumer existed are delivered.
        try:
            await self._redis.xgroup_create(self.stream_key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _detect_features(self) -> None:
        info = await self._redis.info("server")
        self.server_version = parse_version(info.get("redis_version", "0"))
        self._run_id = str(info.get("run_id", ""))
        self._use_xackdel = self.server_version >= (8, 2)

    async def check_server(self) -> bool:
        """Notice a server restart (its run id changed) and re-apply what it forgot; whether it restarted.

        ``notify-keyspace-events`` set with CONFIG SET does not survive a
        restart (unless the config file was rewritten), so it is set again.
        Called when the keyspace listener reconnects and by every scan.
        """
        info = await self._redis.info("server")
        run_id = str(info.get("run_id", ""))
        if run_id == self._run_id:
            return False
        before, self._run_id = self._run_id, run_id
        self.server_version = parse_version(info.get("redis_version", "0"))
        self._use_xackdel = self.server_version >= (8, 2)
        self.recovery._metric("server_restarts_total", "counter", 1)
        self.log.warning("the server restarted (run id %s -> %s)%s", before[:8], run_id[:8],
                         "; setting notify-keyspace-events again" if self.config.configure_keyspace_events else "")
        if self.config.configure_keyspace_events:
            await self._configure_keyspace_events()
        return True

    async def _configure_keyspace_events(self) -> None:
        try:
            reply = await self._redis.config_get("notify-keyspace-events")
            current = _text(next(iter(reply.values()), b"")) if reply else ""
            have = set(current)
            if "A" in have:
                have |= set("g$lshzxetd")
            missing = "".join(f for f in KEYSPACE_FLAGS if f not in have)
            if missing:
                await self._redis.config_set("notify-keyspace-events", current + missing)
            self.keyspace_events_configured = True
        except RedisError as exc:
            self.log.warning(
                "cannot configure notify-keyspace-events (%s); set it to include %r out of band. "
                "Recovery falls back to its other paths.", exc, KEYSPACE_FLAGS)

    # ------------------------------------------------------------ reading ---

    async def _read_loop(self) -> None:
        """Read and lock batches (``read-3.lua``); between empty reads, wait in XREAD BLOCK.

        Delivery and locking are one atomic script, so no entry is ever
        pending without a lock, nor a lock without this consumer's place in
        the deadline index: whenever this consumer dies, the deadline poller
        brings its work back within the lock TTL.

        After a full batch, the next read is sent before the batch is
        dispatched (when capacity allows both), so Redis reads and locks the
        next batch while this one is handed out.
        """
        cfg = self.config
        failures = 0
        delay = cfg.read_retry_initial
        block_ms = max(1, int(cfg.read_block * 1000))
        top: str | None = None  # after an empty read: the newest id, to block on
        # A read sent ahead, before the previous batch was dispatched: (reply task, count asked).
        ahead: tuple[asyncio.Task[list[Any]], int] | None = None

        def free_slots(taking: int = 0) -> int:
            free = cfg.max_streams - len(self._held) - taking
            if self._run_limit:
                free = min(free, self._run_limit - len(self._handlers) - taking)
            return free

        def read_ahead(got: int, asked: int) -> None:
            nonlocal ahead
            free = free_slots(got)
            if got >= asked and free > 0 and not self._stopping.is_set():
                count = min(cfg.read_count, free)
                ahead = (self._send_read(count, ">"), count)

        try:
            while not self._stopping.is_set():
                try:
                    if ahead is not None:
                        sent, asked = ahead
                        ahead = None
                    else:
                        free = free_slots()
                        if free <= 0:
                            self._capacity.clear()
                            try:
                                await asyncio.wait_for(self._capacity.wait(), cfg.read_block)
                            except asyncio.TimeoutError:
                                pass
                            continue
                        if top is not None:
                            wait_from, top = top, None
                            await self._wait_for_entries(wait_from, block_ms)
                            continue
                        if self._reply_lost:
                            # The last read's reply never arrived: the entries it
                            # delivered are in our pending list under locks with our
                            # id. Adopt them before reading more.
                            await self._take_read(self._send_read(cfg.max_streams + cfg.read_count, "0"), "0")
                            self._reply_lost = False
                        asked = min(cfg.read_count, free)
                        sent = self._send_read(asked, ">")
                    top = await self._take_read(sent, ">", lambda got: read_ahead(got, asked))
                except asyncio.CancelledError:
                    raise
                except ResponseError as exc:
                    if "NOGROUP" in str(exc):
                        self.log.warning("group %s or stream %s vanished; recreating it", self.group,
                                         self.stream_key)
                        try:
                            await self._ensure_group()
                            continue
                        except RedisError as again:
                            exc = again  # type: ignore[assignment]
                    failures, delay = await self._read_failed(exc, failures, delay)
                    if failures < 0:
                        return
                    continue
                except (RedisError, OSError) as exc:
                    failures, delay = await self._read_failed(exc, failures, delay)
                    if failures < 0:
                        return
                    continue
                failures, delay = 0, cfg.read_retry_initial
            if ahead is not None:
                # Stopped with a read in flight: its entries are locked for us.
                # Take them (so close() hands them back) rather than leave their
                # locks to expire.
                sent, ahead = ahead[0], None
                await self._take_read(sent, ">")
        finally:
            if ahead is not None:
                # Cancelled or given up with a read in flight: recovery brings
                # its entries back once their locks expire.
                self._reply_lost = True
                ahead[0].cancel()

    def _send_read(self, count: int, start: str) -> asyncio.Task[list[Any]]:
        """Send one ``read-3.lua`` call: read up to ``count`` entries and lock them.

        The request is written before this returns (the task's first step
        runs at once); the task's result is the call's reply.
        """
        sha = self._scripts.read.sha
        head = (self.stream_key, self.fence_key, self.consumers_key, self.group, self.id,
                count, self.config.lock_ttl_ms, self._lock_prefix, start, self._claim_arg, self.lock_owner)

        def build(b: CommandBatch) -> None:
            b.command("EVALSHA", sha, 3, *head)
            b.expect(Shape.SCRIPT_ENTRIES)  # its entries come back as Entry objects

        # Re-reading our own pending entries ("0") takes nothing: safe to send twice.
        return start_task(asyncio.get_running_loop(),
                          self._read_wire.execute(build, self._parser, retry_safe=start != ">"), "lbs-read")

    async def _take_read(self, sent: asyncio.Task[list[Any]], start: str,
                         before_dispatch: Callable[[int], None] | None = None) -> str | None:
        """Take the reply of a :meth:`_send_read`: its entries become held streams.

        Returns the id to block on when nothing was read, else None. Good
        entries become held streams and STREAM_ADDED notifications; malformed
        ones are dead-lettered. ``before_dispatch(n)`` runs once ``n``
        entries are in, before they are handed out (to send the next read).
        """
        try:
            (reply,) = await sent
        except BaseException:
            # Wire returns server errors as values: anything raised here (I/O,
            # cancellation) may have lost a reply whose locks are now ours.
            self._reply_lost = True
            raise
        if isinstance(reply, Exception):
            raise reply
        raw_entries, tokens, top = reply
        if not raw_entries:
            return _text(top) or "0-0"
        if before_dispatch is not None:
            before_dispatch(len(raw_entries))
        bad: list[tuple[Entry, str, str]] = []  # (entry, our lock value, reason): to dead-letter
        max_retries = self.config.max_retries
        acquired, started = self._listening("lbs_lock_acquired"), self._listening("lbs_stream_started")
        dispatch, stats = self._dispatch, self.stats
        taken_at = time.monotonic()
        # Re-reading our pending entries: those being finished are not to be taken again.
        finishing = {h.entry_id for h in self._finishing()} if start != ">" else ()
        for e, tok in zip(raw_entries, tokens):
            tok = self._own_token(tok)
            if not isinstance(tok, int):
                if tok.startswith("WRONGTYPE"):
                    # Not a lock at all: the entry stays pending, and the scan
                    # brings it back once the key is removed.
                    self.log.error("entry %s: its lock key %s holds a value of the wrong type (%s); leaving "
                                   "the entry pending until the key is removed", e.id,
                                   self._lock_key_prefix + e.id, tok)
                elif start == ">":
                    # Someone holds this entry's lock (a slow holder whose entry
                    # was claimed away): leave it pending; it is theirs.
                    self.log.warning("entry %s is locked by %r; leaving it to its holder", e.id, tok)
                continue
            if e.id in self._held or e.id in finishing:
                continue  # re-read: already ours, or being finished
            if e.error is not None:
                bad.append((e, f"{tok}:{self.lock_owner}", str(e.error)))
                continue
            assert e.stream is not None and e.info is not None
            retry_count = e.retry_count
            if e.claimed:
                # Claimed (XREADGROUP CLAIM) from holders that stopped: the
                # count of earlier deliveries is the count of failed attempts.
                retry_count += e.delivery_count
                if 0 <= max_retries < retry_count:
                    bad.append((e, f"{tok}:{self.lock_owner}", f"out of retries: {e.retry_count} re-queued, "
                                                       f"{e.delivery_count} deliveries (claimed)"))
                    continue
            h = self._held.add_new(e.id, e.stream, e.info, retry_count, tok, taken_at)
            stats.taken += 1
            if acquired:
                self._hook("lbs_lock_acquired", stream=h.stream, entry_id=h.entry_id, token=h.token)
            # e.info, not h.info: an empty Info then costs the held record no dict.
            note = Notification(NotificationType.STREAM_ADDED, e.stream, e.id, e.info, retry_count, tok, "", self)
            if started:
                self._hook("lbs_stream_started", notification=note)
            if dispatch is not None:
                dispatch(h, note)
            else:
                await self._mailbox.put(note)
        if bad:
            await self._dead_letter(bad)
        return None

    async def _dead_letter(self, bad: list[tuple[Entry, str, str]], *, again: bool = False) -> None:
        """Dead-letter entries we were delivered (malformed, or claimed past max_retries): one round trip.

        The first try needs our lock (mode ``owned``). What could not be
        dead-lettered (a dead-letter key of the wrong type, a failed
        connection) stays pending to this live consumer, where no recovery
        path looks, so the heartbeat tries it again every tick
        (``again``: mode ``any``; the entry is ours, pending to us, and the
        script acts only while it is pending) until it goes through.
        """
        sha = self._scripts.requeue.sha
        mode = "any" if again else "owned"

        def build(b: CommandBatch) -> None:
            for e, value, reason in bad:
                keys, args = self._requeue_keys_args(e.id, self._lock_key_prefix + e.id, mode=mode,
                                                     value=value, count_retry=False, reason=reason,
                                                     force_dead_letter=True)
                b.command("EVALSHA", sha, len(keys), *keys, *args)

        try:
            results = await self._read_wire.execute(build)
        except RedisError as exc:
            results = [exc] * len(bad)
        log = self.log.debug if again else self.log.error
        for item, res in zip(bad, results):
            e, _, reason = item
            if isinstance(res, Exception) or int(res[0]) == RequeueCode.REFUSED:
                why = str(res) if isinstance(res, Exception) else _text(res[1]).removeprefix("LBSKEY ")
                log("entry %s: %s; cannot dead-letter it (%s): it stays pending and is tried again every "
                    "heartbeat", e.id, reason, why)
                self._undead.append(item)
                continue
            code, detail = int(res[0]), _text(res[1])
            self.log.warning("entry %s: %s: %s", e.id, reason,
                             "dead-lettered as " + detail if code == RequeueCode.DEAD_LETTERED
                             else "dropped (no dead-letter stream)" if code == RequeueCode.DROPPED
                             else f"left alone ({detail})")
            if code in (RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED):
                self._hook("lbs_stream_dead_lettered", entry_id=e.id, reason=reason,
                           dead_letter_id=detail if code == RequeueCode.DEAD_LETTERED else "")

    async def _wait_for_entries(self, after: str, block_ms: int) -> None:
        """``XREAD BLOCK`` on the reader's own connection until an entry newer than ``after`` exists.

        It delivers nothing (plain XREAD, no group), so it can be woken or
        dropped at any time without stranding work. The reader holds one
        pool connection for this and knows its CLIENT ID, so :meth:`close`
        wakes it with CLIENT UNBLOCK.
        """
        conn = self._read_conn
        if conn is None:
            conn = self._read_conn = await self._redis.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            if not conn.is_connected or self._reader_client_id is None:
                await conn.connect()
                await conn.send_command("CLIENT", "ID")
                self._reader_client_id = int(await conn.read_response())
            if self._stopping.is_set():
                return
            self._reading = True  # before sending: sending can yield, and close() must see it
            try:
                await conn.send_command("XREAD", "COUNT", 1, "BLOCK", block_ms, "STREAMS", self.stream_key, after)
                await conn.read_response()
            finally:
                self._reading = False
        except ResponseError:
            raise  # a server error reply: the connection is fine
        except BaseException:
            self._reader_client_id = None
            await conn.disconnect()
            raise

    async def _read_failed(self, exc: BaseException, failures: int, delay: float) -> tuple[int, float]:
        """Back off after a failed read; returns (-1, 0) when the reader gives up."""
        cfg = self.config
        failures += 1
        self.recovery._metric("read_failures_total", "counter", 1)
        await self._after_failure(exc)
        if cfg.read_max_retries >= 0 and failures > cfg.read_max_retries:
            self.log.error("reader giving up after %d failed reads: %s", failures, exc)
            self._hook("lbs_reader_terminated", error=exc)
            self._mailbox.put_nowait(Notification(NotificationType.STREAM_TERMINATED, reason=str(exc)))
            return -1, 0.0
        sleep = random.uniform(delay / 2, delay)  # jitter, so a fleet does not retry in step
        self.log.warning("read failed (%s: %s); retry %d in %.2fs", type(exc).__name__, exc, failures, sleep)
        try:
            await asyncio.wait_for(self._stopping.wait(), sleep)
        except asyncio.TimeoutError:
            pass
        return failures, min(delay * 2, cfg.read_retry_max)

    def _own_token(self, tok: Any) -> int | str:
        """The token of a lock that is ours, else the lock's value as text.

        A retried take (its first reply was lost with the connection) finds
        the locks the first attempt set: "<token>:<our id>:<our instance>".
        Only this very process's locks are adopted: another process started
        with the same consumer id (refused at start, but possible by hand)
        reads from the same pending list, and its locks stay its own.
        """
        if isinstance(tok, int):
            return tok
        if isinstance(tok, bytes):
            tok = tok.decode(errors="replace")
        text = str(tok)
        token, _, owner = text.partition(":")
        if owner == self.lock_owner and token.isdigit():
            return int(token)
        return text

    def _requeue_keys_args(self, entry_id: str, lock_key: str, *, mode: str, value: str, count_retry: bool,
                           reason: str, force_dead_letter: bool = False) -> tuple[list[Any], list[Any]]:
        """KEYS and ARGV of ``requeue-3.lua`` (see its header)."""
        cfg = self.config
        keys = [self.stream_key, self.dead_letter_key or _keys.dead_letter_stream(self.service), lock_key]
        args = [self.group, entry_id, mode, value, 1 if count_retry else 0, cfg.max_retries,
                self.retry_field, self.original_field, reason, self.id,
                1 if force_dead_letter else 0, 1 if self.dead_letter_key else 0, cfg.field_prefix]
        return keys, args

    async def _requeue_call(self, pipe: Any, entry_id: str, lock_key: str, *, mode: str, value: str,
                            count_retry: bool, reason: str, force_dead_letter: bool = False) -> Any:
        keys, args = self._requeue_keys_args(entry_id, lock_key, mode=mode, value=value, count_retry=count_retry,
                                             reason=reason, force_dead_letter=force_dead_letter)
        return await self._scripts.requeue(keys=keys, args=args, client=pipe)

    # ---------------------------------------------------------- heartbeat ---

    async def _heartbeat_loop(self) -> None:
        every = self.config.heartbeat_every
        wait = every
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._stopping.wait(), wait)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await self.heartbeat()
                wait = every
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.recovery._metric("heartbeat_failures_total", "counter", 1)
                await self._after_failure(exc)
                # The Wire already tried a fresh connection; try again soon, well
                # before the locks (extended at most a tick ago) can expire.
                wait = every / 4
                self.log.warning("heartbeat failed: %s; next try in %.2fs", exc, wait)

    async def heartbeat(self) -> int:
        """Extend every held lock now, in one round trip; return how many were lost.

        Every lock is extended; the pending idle time is refreshed for a
        rotating share of the entries (``Config.pel_refresh_every``).

        The locks go in script calls of ``Config.heartbeat_chunk``, each
        written as soon as it is encoded (Redis runs one while the next is
        encoded). The heartbeat task calls this every
        ``Config.heartbeat_every`` seconds.
        """
        snapshot = self._held.values()
        held = len(snapshot)
        finishing = self._finishing()
        if finishing:  # still ours until Redis answers their done: keep them alive
            snapshot += finishing
        started = time.perf_counter()
        chunk = self.config.heartbeat_chunk
        # At least one call, even holding nothing: it keeps the instance marker alive.
        starts = range(0, max(1, len(snapshot)), chunk)
        sha, ttl = self._scripts.extend.sha, self.config.lock_ttl_ms
        head_keys = (self.stream_key, self.consumers_key, self.instance_key)
        # The last call of the tick moves this consumer's deadline and its instance marker (extend-n.lua).
        head_args = (ttl, self.group, self.id, 0, self.instance)
        last_args = (ttl, self.group, self.id, 1, self.instance)
        encode = self._held.encode_extend
        every = self.config.pel_refresh_every
        phase = self._beats % every
        self._beats += 1

        def build(b: CommandBatch, k: int) -> None:
            start = starts[k]
            encode(b, sha, head_keys, last_args if k == len(starts) - 1 else head_args, snapshot, start,
                   min(start + chunk, len(snapshot)), every, phase)

        try:
            # Extending a lock checks its value first: sending a tick twice is harmless.
            results = _raise_first_error(await self._beat_wire.execute_chunks(len(starts), build, retry_safe=True))
        except RedisError as exc:
            raise RedisOperationError("heartbeat", exc) from exc
        lost: list[Held] = []
        for start, positions in zip(starts, results):
            for p in positions:
                if isinstance(p, int):
                    lost.append(snapshot[start + p - 1])
                else:
                    self._tick_warning(_text(p))
        lost = [h for h in lost if self._drop_held(h)]
        for h in lost:
            self._disown(h, "lock expired or taken while held (heartbeat missed)")
        if held:  # a tick holding nothing only kept the instance marker alive
            self._hook("lbs_locks_extended", extended=held - len(lost), lost=len(lost),
                       seconds=time.perf_counter() - started)
        if lost:
            # We live, so the consumer deadline index will not send anyone for
            # these: put back the ones whose lock is gone (not those someone
            # else holds) ourselves. The loss was not the stream's fault (a
            # stall, an eviction): no retry is counted.
            try:
                await self.recovery.requeue([h.entry_id for h in lost], "heartbeat",
                                            "lock lost while held (heartbeat missed)", count_retry=False)
            except RedisError as exc:
                self.log.warning("re-queue of %d lost assignments failed (%s); the scan will", len(lost), exc)
        if self.config.hold_warning is not None:
            self._report_overdue(self.config.hold_warning)
        if self._undead:
            retry, self._undead = self._undead, []
            await self._dead_letter(retry, again=True)
        return len(lost)

    def _tick_warning(self, what: str) -> None:
        """Something the tick's last call could not do (extend-n.lua's string outputs)."""
        if what.startswith("INSTANCE"):
            self.recovery._metric("duplicate_consumer_total", "counter", 1)
            self.log.error("another live process runs with consumer id %s (instance %s, this one %s): their "
                           "locks and pending entries mix; give each process its own id", self.id,
                           what.partition(" ")[2], self.instance)
        else:
            self.recovery._metric("wrong_type_keys_total", "counter", 1)
            self.log.error("heartbeat: %s", what.removeprefix("LBSKEY "))

    def _report_overdue(self, limit: float) -> None:
        """Warn once per stream held longer than ``limit`` seconds; the ``held_overdue`` gauge counts them.

        Looked at no more often than every ``limit / 10`` seconds: the walk
        and the set are as long as the overdue streams are many.
        """
        now = time.monotonic()
        if now < self._overdue_next:
            return
        self._overdue_next = now + limit / 10
        overdue = self._held.taken_before(now - limit)
        warned = self._overdue_warned
        if warned:
            warned.intersection_update(h.entry_id for h in overdue)
        for h in overdue:
            if h.entry_id not in warned:
                warned.add(h.entry_id)
                self.log.warning("%s (entry %s, token %d) has been held for over %.0fs without being finished: "
                                 "call done_stream or hand_back, or use `async with notification:`",
                                 h.stream, h.entry_id, h.token, limit)
        self.recovery._metric("held_overdue", "gauge", len(overdue))

    def _disown(self, h: Held, reason: str) -> None:
        self._tombstone(h)
        self.log.warning("lost the lock of %s (entry %s, token %d): %s", h.stream, h.entry_id, h.token, reason)
        self._hook("lbs_stream_disowned", stream=h.stream, entry_id=h.entry_id, token=h.token)
        if h.task is not None and not h.task.done():
            h.task.cancel()
        self._mailbox.put_nowait(Notification(NotificationType.STREAM_DISOWNED, h.stream, h.entry_id, h.info,
                                              h.retry_count, h.token, reason))

    # --------------------------------------------------------------- done ---

    def _find(self, stream: str, entry_id: str | None) -> Held | None:
        return self._held.find(stream, entry_id)

    async def done_stream(self, stream: str, entry_id: str | None = None) -> DoneStatus:
        """Finish a data stream: release its lock, ack and delete its entry, in one call.

        With several assignments of one name held, ``entry_id`` picks one (the
        oldest otherwise). Returns :class:`lbs.DoneStatus`: ``DONE``, or a lost
        lock (``LOCK_EXPIRED``: acked now, no duplicate; ``LOCK_LOST``: the
        stream was handed on and may be processed twice). Raises
        :class:`lbs.NotHeldError` for a stream this client never held (or
        already finished). While Redis is unreachable (a dropped connection,
        a restart, a failover) the call is sent again with back-off, the lock
        kept alive meanwhile, until Redis answers; :class:`lbs.RedisOperationError`
        when Redis refuses it, or when the client closes first.
        """
        _check_name(stream, entry_id)
        h = self._find(stream, entry_id)
        if h is not None:
            self._drop_held(h)
        else:
            h = self._tombstones.get(stream)
            if h is None or (entry_id is not None and h.entry_id != entry_id):
                raise NotHeldError(f"{self.id} does not hold data stream {stream!r}")
            del self._tombstones[stream]
        (status,) = await self._finish([h])
        return status

    async def done_streams(self, streams: Iterable[str | Notification]) -> list[DoneStatus]:
        """:meth:`done_stream` for many streams in one round trip.

        Items are stream names or the STREAM_ADDED notifications themselves
        (which pin the entry id). Statuses come back in order. Raises
        :class:`lbs.NotHeldError` before touching Redis if any is not held.
        """
        if isinstance(streams, (str, bytes)):
            raise ConfigurationError("done_streams takes a list of names or notifications, not one name")
        picked: list[Held] = []
        for item in streams:
            name, entry_id = (item.stream, item.entry_id) if isinstance(item, Notification) else (item, None)
            _check_name(name, entry_id)
            h = self._find(name, entry_id)
            if h is None:
                h = self._tombstones.get(name)
                if h is None or (entry_id is not None and h.entry_id != entry_id) or h in picked:
                    raise NotHeldError(f"{self.id} does not hold data stream {name!r}")
            elif h in picked:
                # A second item naming the same stream takes the next held entry of it.
                rest = [x for x in self._held.for_stream(name) if x not in picked]
                if not rest:
                    raise NotHeldError(f"{self.id} does not hold data stream {name!r} that many times")
                h = rest[0]
            picked.append(h)
        for h in picked:
            if not self._drop_held(h):
                self._tombstones.pop(h.stream, None)
        return await self._finish(picked)

    def _queue_done(self, h: Held, fut: asyncio.Future[Any] | None) -> None:
        """Queue ``h`` for the finisher's next batch; ``fut`` gets the done code (None: log only)."""
        self._done_queue.append((h, fut))
        if self._finisher is None or self._finisher.done():
            self._finisher = asyncio.create_task(self._finish_loop(), name=f"lbs-finisher-{self.id}")
        self._done_idle.clear()
        self._done_wakeup.set()

    async def _finish(self, items: list[Held]) -> list[DoneStatus]:
        """Queue ``items`` for the finisher and wait for their outcome.

        Every concurrent ``done_stream`` (a ``run()`` with many handlers)
        joins the next batch: one pipelined round trip per batch, one
        connection, however many handlers finish at once.
        """
        if not items:
            return []
        loop = asyncio.get_running_loop()
        futures = []
        for h in items:
            fut: asyncio.Future[Any] = loop.create_future()
            self._queue_done(h, fut)
            futures.append(fut)
        codes = [await futures[0]] if len(futures) == 1 else await asyncio.gather(*futures)
        return [self._finished(h, code) for h, code in zip(items, codes)]

    async def _finish_loop(self) -> None:
        """Send queued finishes, one ``done-n.lua`` call per batch; keep trying the ones Redis did not answer.

        A done is a commitment: if the connection or the server fails, the
        batch is sent again (flagged as a retry, so an entry a lost call
        finished reads ALREADY_DONE) with back-off until Redis answers,
        while the heartbeat keeps its locks alive. Dropping it instead would
        let the lock expire and the stream run a second time.
        """
        flag = 1 if self._use_xackdel else 0
        sha = self._scripts.done.sha
        delay = self.config.read_retry_initial
        while True:
            if not self._done_queue and not self._done_retry:
                self._done_idle.set()
                await self._done_wakeup.wait()
                self._done_wakeup.clear()
                continue
            queue, retrying = (self._done_retry, 1) if self._done_retry else (self._done_queue, 0)
            batch = self._done_inflight = queue[:DONE_BATCH]
            del queue[:DONE_BATCH]
            items = [h for h, _ in batch]

            def build(b: CommandBatch) -> None:
                b.evalsha_locks(sha, (self.stream_key,), self._lock_prefix, [h.entry_id for h in items],
                                (self.group, flag, retrying), [h.value for h in items])

            try:
                try:
                    (codes,) = _raise_first_error(await self._done_wire.execute(build))
                except RedisConnectionError:
                    # The connection failed with the call in flight: it may have
                    # run. Send it once more on a fresh connection, saying so.
                    retrying = 1
                    (codes,) = _raise_first_error(await self._done_wire.execute(build))
            except asyncio.CancelledError:
                self._done_inflight = []
                for _, fut in batch:
                    if fut is not None:
                        fut.cancel()
                raise
            except Exception as exc:
                self._done_inflight = []
                self.recovery._metric("done_failures_total", "counter", len(batch))
                await self._after_failure(exc)
                if _topology_error(exc):  # Redis unreachable, restarting or failing over: try again
                    self._done_retry[:0] = batch
                    wait = random.uniform(delay / 2, delay)
                    self.log.warning("finishing %d streams failed (%s); trying again in %.2fs, their locks "
                                     "kept alive", len(batch), exc, wait)
                    await asyncio.sleep(wait)
                    delay = min(delay * 2, self.config.read_retry_max)
                    continue
                err = RedisOperationError("done_stream", exc) if isinstance(exc, RedisError) else exc
                for h, fut in batch:
                    if fut is None:
                        self.log.error("finishing %s failed (%s); its lock will expire", h.stream, err)
                    elif not fut.done():
                        fut.set_exception(err)
                continue
            self._done_inflight = []
            delay = self.config.read_retry_initial
            released = self._listening("lbs_lock_released")
            for (h, fut), code in zip(batch, codes):
                if fut is None:
                    self._finished(h, code, released)
                elif not fut.done():
                    fut.set_result(code)

    def _finishing(self) -> list[Held]:
        """Streams handed to the finisher whose done Redis has not answered yet (the heartbeat extends them)."""
        if not (self._done_queue or self._done_inflight or self._done_retry):
            return []
        return [h for q in (self._done_queue, self._done_inflight, self._done_retry) for h, _ in q]

    def _finished(self, h: Held, code: Any, released: bool = True) -> DoneStatus:
        status = _DONE_STATUS.get(code, DoneStatus.LOCK_LOST)
        stats = self.stats
        stats.finished += 1
        self._finished_event.set()
        if status is DoneStatus.DONE:
            stats.done += 1
        elif status is DoneStatus.LOCK_EXPIRED:
            stats.lock_expired += 1
        else:
            stats.lock_lost += 1
        if status.lost:
            self.log.warning("done_stream(%s): %s (entry %s, token %d)", h.stream, status.value, h.entry_id, h.token)
        if released:
            self._hook("lbs_lock_released", stream=h.stream, entry_id=h.entry_id, token=h.token, status=status)
        return status

    # ---------------------------------------------------------- hand-back ---

    async def hand_back(self, stream: str, entry_id: str | None = None, *, count_retry: bool = False,
                        reason: str = "handed back") -> str:
        """Give a held stream back to the LBS as a fresh entry, now.

        With ``count_retry`` its ``_retry_count`` goes up, and past
        ``Config.max_retries`` it goes to the dead-letter stream instead.
        Returns the new entry id ("" when dead-lettered, dropped or the lock
        was already lost). Under :meth:`run`, the stream's handler is
        cancelled, and has ended, before the stream goes back (unless the
        handler itself is the caller), so this process never runs two
        handlers for one stream.
        """
        _check_name(stream, entry_id)
        h = self._find(stream, entry_id)
        if h is None:
            raise NotHeldError(f"{self.id} does not hold data stream {stream!r}")
        self._drop_held(h)
        task = h.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            await cancel_and_wait([task])
        return (await self._hand_back_many([h], count_retry=count_retry, reason=reason))[0]

    async def _hand_back_many(self, items: list[Held], *, count_retry: bool, reason: str) -> list[str]:
        if not items:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for h in items:
            await self._requeue_call(pipe, h.entry_id, h.lock_key, mode="owned", value=h.value,
                                     count_retry=count_retry, reason=reason)
        try:
            results = await execute(pipe)
        except RedisError as exc:
            raise RedisOperationError("hand back", exc) from exc
        out = []
        for h, res in zip(items, results):
            code, detail = int(res[0]), _text(res[1])
            if code == RequeueCode.REQUEUED:
                self._hook("lbs_stream_handed_back", stream=h.stream, entry_id=h.entry_id,
                           new_entry_id=detail, retry_counted=count_retry)
                out.append(detail)
            elif code in (RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED):
                self.log.warning("%s (entry %s) is out of retries: dead-lettered (%s)", h.stream, h.entry_id, reason)
                self._hook("lbs_stream_dead_lettered", entry_id=h.entry_id, reason=reason,
                           dead_letter_id=detail if code == RequeueCode.DEAD_LETTERED else "")
                out.append("")
            elif code == RequeueCode.REFUSED:
                self.log.error("could not hand back %s (entry %s): %s; it stays pending and recovery retries "
                               "once its lock expires", h.stream, h.entry_id, detail.removeprefix("LBSKEY "))
                out.append("")
            else:
                self.log.warning("could not hand back %s (entry %s): %s", h.stream, h.entry_id, detail)
                out.append("")
        return out

    async def claim(self, entry: str | Notification) -> bool:
        """Recover one assignment now if its lock is gone (Go parity).

        ``entry`` is an LBS entry id or a notification carrying one. The
        assignment goes back to the LBS with one more retry counted (or to
        the dead-letter stream past ``max_retries``). Returns True if this
        call did it; False if its lock is alive (the holder keeps it) or
        someone else already recovered it.
        """
        entry_id = entry.entry_id if isinstance(entry, Notification) else entry
        try:
            (code,) = await self.recovery.requeue([entry_id], "claim", f"claimed by {self.id}")
        except RedisError as exc:
            raise RedisOperationError("claim", exc) from exc
        return code in (RequeueCode.REQUEUED, RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED)

    # ------------------------------------------------------ notifications ---

    async def notifications(self) -> AsyncIterator[Notification]:
        """Notifications in order, until the client is closed.

        Meant for one consumer at a time. The buffer is bounded
        (``Config.notification_buffer``): while it is full the reader waits.
        """
        while True:
            note = await self._mailbox.get()
            if note is None:
                return
            yield note

    async def next_notification(self, timeout: float | None = None) -> Notification | None:
        """The next notification, or None when closed (or after ``timeout`` seconds)."""
        try:
            return await asyncio.wait_for(self._mailbox.get(), timeout)
        except asyncio.TimeoutError:
            return None

    def drain_notifications(self, limit: int | None = None) -> list[Notification]:
        """The notifications already buffered (up to ``limit``), without waiting.

        For applications that work in batches: await one notification, then
        drain the rest and finish them together with :meth:`done_streams`.
        """
        out: list[Notification] = []
        while (limit is None or len(out) < limit) and len(self._mailbox):
            note = self._mailbox.get_nowait()
            if note is None:
                break
            out.append(note)
        return out

    # ---------------------------------------------------------------- run ---

    async def run(self, handler: Handler | None = None, concurrency: int | None = None, *,
                  handle_signals: bool = True) -> None:
        """Call ``await handler(notification)`` for every assigned stream until closed.

        Without ``handler``, a plugin provides it (hook ``lbs_handler``).

        When the handler returns, the stream is finished as by
        :meth:`done_stream` (batched with every other stream finishing at
        the same time); when it raises, the stream is handed back with a
        retry counted (so a stream that always fails ends in the dead-letter
        stream). A disowned stream's handler is cancelled. At most
        ``concurrency`` handlers run at once (default ``Config.max_streams``):
        the reader takes no more streams than there is room to run.

        Each handler runs in its own task, started eagerly: its first step
        runs as soon as the stream is taken, and a handler that finishes
        without suspending never waits for the event loop. Returns once
        :meth:`close` (from anywhere) has finished.

        With ``handle_signals`` (the default) and when called in the main
        thread, SIGTERM and SIGINT start :meth:`close` for the duration of
        the call: reading stops, running handlers get
        ``Config.drain_timeout`` to finish, and the rest are handed back
        without a retry counted; ``run()`` then returns normally (a worker's
        exit code 0). A second signal stops the drain at once.
        """
        if self._dispatch is not None:
            raise ConfigurationError("run() is already running on this client")
        if handler is None:
            handler = self.pm.hook.lbs_handler(client=self)
            if handler is None:
                raise ConfigurationError("run() needs a handler: pass one, or install a plugin that "
                                         "implements the lbs_handler hook")
        if not callable(handler):
            raise ConfigurationError(f"run() needs a callable handler, got {type(handler).__name__}")
        if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                        or concurrency < 1):
            raise ConfigurationError(f"concurrency must be an integer of at least 1, got {concurrency!r}")
        loop = asyncio.get_running_loop()
        on_done = self._handler_done

        def dispatch(h: Held, note: Notification) -> None:
            try:
                aw = handler(note)
                coro = aw if type(aw) is CoroutineType else _awaited(aw)
            except Exception as exc:  # a plain function that raised: a failed handler
                coro = _raised(exc)
            task = start_task(loop, coro, f"lbs-handler-{h.stream}")
            if task.done():
                on_done(h, task)
            else:
                h.task = task
                self._handlers.add(task)
                task.add_done_callback(partial(on_done, h))

        self._dispatch = dispatch
        self._run_limit = concurrency if concurrency is not None and concurrency < self.config.max_streams else 0
        catching = handle_signals and _SIGNALS.catch(loop, self)
        try:
            await self.start()
            # STREAM_ADDED goes straight to dispatch; the other notifications
            # (disowned, expired, terminated) are drained so they never fill the box.
            async for _ in self.notifications():
                pass
            if self._handlers:
                await asyncio.gather(*self._handlers, return_exceptions=True)
            if self._closing is not None:
                await asyncio.shield(self._closing)  # close() ran elsewhere: return once it is over
        finally:
            if catching:
                _SIGNALS.release(loop, self)
            self._dispatch = None
            self._run_limit = 0

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._closing is None:
            self.log.warning("%s: stopping (drain %.1fs, then hand back)", sig.name, self.config.drain_timeout)
            asyncio.ensure_future(self.close())
        else:
            self.log.warning("%s again: handing back without waiting for handlers", sig.name)
            self._drain_cut.set()

    def _handler_done(self, h: Held, task: asyncio.Task[Any]) -> None:
        """A run() handler ended: finish its stream, or hand it back if it raised."""
        h.task = None
        self._handlers.discard(task)
        if self._run_limit:
            self._capacity.set()
        if self._held.get(h.entry_id) is not h:
            return  # disowned or handed back while it ran: the stream is not ours to finish
        if task.cancelled():
            if self._stopping.is_set():
                return  # close() ran out of drain time: it hands the stream back
            # Cancelled by someone else: hand it back (a retry counted, as for a
            # failure), or the held stream would leak under a healthy heartbeat.
            exc: BaseException | None = asyncio.CancelledError("the handler was cancelled")
        else:
            exc = task.exception()
        self._drop_held(h)
        if exc is None:
            self._queue_done(h, None)
            return
        self.log.warning("handler failed on %s (entry %s): %r; handing it back", h.stream, h.entry_id, exc)
        hand_back = asyncio.ensure_future(self._hand_back_failed(h, exc))
        self._handlers.add(hand_back)
        hand_back.add_done_callback(self._handlers.discard)

    async def _hand_back_failed(self, h: Held, exc: BaseException) -> None:
        try:
            await self._hand_back_many([h], count_retry=True, reason=f"handler raised {exc!r}"[:500])
        except RedisOperationError as err:
            self.log.error("hand-back of %s failed (%s); its lock will expire", h.stream, err)

    async def wait_finished(self, count: int, timeout: float | None = None) -> None:
        """Wait until ``stats.finished`` (streams finished, whatever the outcome) reaches ``count``.

        Raises :class:`asyncio.TimeoutError` after ``timeout`` seconds.
        """
        async def reached() -> None:
            while self.stats.finished < count:
                self._finished_event.clear()
                await self._finished_event.wait()

        await asyncio.wait_for(reached(), timeout)

    # -------------------------------------------------------------- close ---

    async def close(self) -> None:
        """Stop reading, hand every held stream back to the LBS at once, and stop.

        Handed-back streams become fresh entries (no retry counted, lock
        released), so another consumer gets them without waiting for a TTL.
        Running ``run()`` handlers get ``Config.drain_timeout`` seconds to
        finish first. Idempotent and safe from any task: every call returns
        once the one shutdown has finished (cancelling a caller does not stop
        the shutdown).
        """
        if self._closing is None:
            self._closed = True
            self._closing = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._closing)

    async def _shutdown(self) -> None:
        self._stopping.set()
        self._capacity.set()
        # Undelivered STREAM_ADDED notifications are dropped: their streams are
        # held, so they are handed back below. A reader waiting to deliver one
        # is released at once.
        self._mailbox.close(discard=True)
        if self._reader is not None:
            await self._stop_reader()
        await self.recovery.stop()
        if self._forwarder is not None:
            await self._forwarder.stop()
        running = [t for t in self._handlers if not t.done()]
        if running and self.config.drain_timeout > 0:
            # Until every handler ended, the drain time is up, or a second signal cuts it short.
            ended = asyncio.ensure_future(asyncio.wait(running))
            cut = asyncio.ensure_future(self._drain_cut.wait())
            await asyncio.wait([ended, cut], timeout=self.config.drain_timeout, return_when=asyncio.FIRST_COMPLETED)
            for waiter in (ended, cut):
                waiter.cancel()
        await cancel_and_wait(running)
        handed = self._held.values()
        for h in handed:
            self._drop_held(h)
        handed_back = 0
        try:
            results = await self._hand_back_many(handed, count_retry=False, reason=f"{self.id} shut down")
            handed_back = sum(1 for r in results if r)
        except RedisOperationError as exc:
            self.recovery._metric("hand_back_failures_total", "counter", len(handed))
            self.log.error("hand-back on close failed (%s); %d locks will expire instead", exc, len(handed))
        if self._finisher is not None and not self._finisher.done():
            # Streams whose handlers finished are queued for done-n.lua: send them.
            try:
                await asyncio.wait_for(self._done_idle.wait(), self.config.read_block + 5.0)
            except asyncio.TimeoutError:
                unsent = [*self._done_queue, *self._done_retry]
                self.log.error("finisher did not drain; %d finished streams' locks will expire", len(unsent))
                gone = RedisOperationError("done_stream", RedisConnectionError("the client closed before Redis "
                                                                               "answered"))
                for _, fut in unsent:
                    if fut is not None and not fut.done():
                        fut.set_exception(gone)
        await cancel_and_wait([self._heartbeat, self._finisher])
        if self._started:
            await self._release_instance()
        for wire in (self._read_wire, self._done_wire, self._beat_wire):
            await wire.close()
        self.log.info("closed; handed back %d streams", handed_back)
        self._hook("lbs_client_closed", handed_back=handed_back)
        if self._cluster is not None:
            await self._redis.aclose()  # our client of the slot owner
            if self._owned:
                await self._cluster.aclose()
        elif self._owned:
            await self._redis.aclose()

    async def _stop_reader(self) -> None:
        """End the reader without losing a read batch.

        A blocked XREAD is woken with CLIENT UNBLOCK (it returns as if it
        timed out), and a reader busy taking locks finishes that batch, so
        every entry it read is either held (and handed back) or untouched.
        Cancelling is the last resort, after one more read_block.
        """
        reader = self._reader
        assert reader is not None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.config.read_block + 1.0
        unblock = True
        while not reader.done():
            if self._reading and self._reader_client_id is not None and unblock:
                # Sent again until the reader leaves its XREAD: an UNBLOCK that
                # overtakes the XREAD it is meant for finds nothing to wake.
                try:
                    await self._redis.client_unblock(self._reader_client_id)
                except RedisError as exc:
                    unblock = False
                    self.log.debug("CLIENT UNBLOCK refused (%s); waiting for the read to time out", exc)
            if loop.time() > give_up:
                await cancel_and_wait([reader])
                break
            await asyncio.wait([reader], timeout=0.005)
        if reader.done() and not reader.cancelled():
            reader.exception()  # retrieved: the reader logs its own failures
        if self._read_conn is not None:
            await self._redis.connection_pool.release(self._read_conn)
            self._read_conn = None

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<lbs.Client {self.id} service={self.service!r} held={len(self._held)}>"


class _SignalRoute:
    """SIGTERM/SIGINT to every client in ``run()`` on the main thread's loop.

    One handler per signal for the process, installed while at least one
    ``run()`` asks for it, so clients sharing a loop (a sharded client, the
    demo) all hear the signal, and the last one out restores the default.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.clients: list[Client] = []
        self.before: dict[signal.Signals, Any] = {}  # the handlers to put back

    def catch(self, loop: asyncio.AbstractEventLoop, client: Client) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        if not self.clients:
            self.before = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
            try:
                for sig in self.SIGNALS:
                    loop.add_signal_handler(sig, self._deliver, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # no Unix signals on this loop
                self._restore(loop)
                return False
        self.clients.append(client)
        return True

    def release(self, loop: asyncio.AbstractEventLoop, client: Client) -> None:
        self.clients.remove(client)
        if not self.clients:
            self._restore(loop)

    def _restore(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig, handler in self.before.items():
            loop.remove_signal_handler(sig)
            if handler is not None:
                signal.signal(sig, handler)  # asyncio would leave SIG_DFL: the application's own comes back

    def _deliver(self, sig: signal.Signals) -> None:
        for client in list(self.clients):
            client._on_signal(sig)


_SIGNALS = _SignalRoute()


async def _awaited(aw: Awaitable[Any]) -> Any:
    return await aw


async def _raised(exc: BaseException) -> None:
    raise exc


def _check_name(stream: object, entry_id: object) -> None:
    """Refuse arguments that cannot name a held stream (a caller's mistake, not "not held")."""
    if not isinstance(stream, str):
        raise ConfigurationError(f"a data stream name is a str, got {type(stream).__name__}")
    if entry_id is not None and not isinstance(entry_id, str):
        raise ConfigurationError(f"entry_id must be a str or None, got {type(entry_id).__name__}")


def _raise_first_error(replies: list[Any]) -> list[Any]:
    """``replies`` of a batch, or the first server error among them, raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _topology_error(exc: BaseException) -> bool:
    """Whether ``exc`` may mean the slot's owner changed (or is unreachable)."""
    if isinstance(exc, RedisOperationError) and exc.cause is not None:
        exc = exc.cause
    return redirected(exc) or isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError))
