"""The consumer's facade: :class:`Client` starts, stops and answers; its activities do the work.

Per client, whatever the number of held streams (see lbs._consumer):

* the **reader** reads batches up to the free capacity (a plain ``XREADGROUP``,
  then one ``MULTI`` that takes the batch's token and names; ``read-3.lua`` only
  re-reads after a read whose reply was lost), held by the consumer's lease,
  and hands each stream to ``run()``'s handlers or the notification mailbox;
* the **heartbeat** extends the lease in one round trip per tick, whatever it holds;
* the **finisher** batches every ``done_stream`` into one round trip;
* **recovery** brings dead consumers' streams back (poller, listener, scan);
  **requeue** is every hand-back and re-queue; **controls** obey operators.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterable

import pluggy
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from _lbscore import Held

from . import _keys
from ._consumer import serve as serving
from ._consumer.intake import Dispatch
from ._consumer.lifecycle import Lifecycle
from ._consumer.runner import Handler
from ._consumer.slots import SharedSlots
from ._consumer.state import ClientState, ClientStats, ConsumerLog, Names, consumer_id_from_env
from ._consumer.topology import Topology
from ._redis.connection import ClusterMode, RedisLike, cancel_and_wait, resolve_client
from ._waits import within
from .config import Config, require_number
from .exceptions import ConfigurationError, NotHeldError, RedisOperationError
from .keyed import KeyedHandler
from .notifications import DoneStatus, Notification
from .plugins import Hooks, MetricValues, make_plugin_manager, plugin_config_defaults
from .strategy import ReadStrategy

__all__ = ["Client", "ClientStats", "Handler", "Held", "consumer_id_from_env"]

log = logging.getLogger("lbs.client")


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
        _slots: SharedSlots | None = None,  # a ShardedClient's: its shards' capacity is one
    ) -> None:
        #: The service's name: its LBS is ``<service>-input``.
        self.service = _keys.validate_service(service)
        if config is not None and not isinstance(config, Config):
            raise ConfigurationError(f"config must be an lbs.Config, got {type(config).__name__}")
        self.pm: pluggy.PluginManager = make_plugin_manager(
            plugins,
            load_entrypoints=load_entrypoint_plugins,
            disabled=config.disabled_plugins if config is not None else (),
        )
        # Without an explicit Config, plugins may contribute defaults (hook lbs_config_defaults).
        #: The settings: ``config`` as given, else the defaults with what plugins contribute.
        self.config = config if config is not None else Config(**plugin_config_defaults(self.pm))
        #: The consumer id: ``redis-consumer-<consumer_id or $POD_NAME or $POD_IP>``.
        self.id = consumer_id_from_env(consumer_id)
        #: This process's instance nonce: the value of its lease ``{<service>-input}:lease:<id>``,
        #: which holds what is pending to this consumer; a second live process with the same
        #: consumer id is refused at start.
        self.instance = uuid.uuid4().hex[:12]
        names = Names.of(self.service, self.id, self.instance, self.config)
        self.lock_owner = names.lock_owner
        self.stream_key = names.stream_key
        self.group = names.group
        self.fence_key = names.fence_key
        self.consumers_key = names.consumers_key
        self.lease_key = names.lease_key
        self.dead_letter_key = names.dead_letter_key
        source, owned = resolve_client(redis, cluster=cluster)
        cluster_client = source if isinstance(source, RedisCluster) else None
        if cluster_client is not None and self.config.go_compatible:  # (nothing connected yet)
            raise ConfigurationError(
                "Config.go_compatible needs a single Redis: the Go reference client's "
                "lock keys have no hash tag, so they are in other slots than the LBS"
            )
        self.log = ConsumerLog(log, {"consumer_id": self.id, "service": self.service})
        self._hooks = Hooks(self.pm, self, {"service": self.service, "consumer": self.id}, self.log)
        link = Topology.first_link(source)
        self._state = s = ClientState(self.config, names, self._hooks, self.log, link, self, _slots)
        self._life = life = Lifecycle(s, cluster_client, owned)
        self._requeue, self._finisher, self._heartbeat = life.requeue, life.finisher, life.heartbeat
        self._handover = life.handover
        #: The recovery tasks (deadline poller, keyspace listener, scan); see lbs._consumer.recovery.
        self.recovery = life.recovery
        #: Counters of what this client did (cheap, always on).
        self.stats = s.stats

    # ------------------------------------------------------------ answers ---

    @property
    def held(self) -> int:
        """How many data streams this client holds now."""
        return len(self._state.holdings)

    def held_streams(self) -> list[Held]:
        """The held streams (a snapshot)."""
        return self._state.holdings.table.values()

    def find_held(self, stream: str, entry_id: str | None = None) -> Held | None:
        """The held assignment of ``stream`` (``entry_id`` picks one; the oldest otherwise), or None."""
        try:
            return self._state.holdings.find(stream, entry_id)
        except NotHeldError:
            return None

    @property
    def metrics(self) -> MetricValues:
        """Metric values by name since start (counters summed; gauges and histograms the last value),
        and by name and labels in ``.series``."""
        return self._hooks.counts

    @property
    def read_strategy(self) -> ReadStrategy:
        """How this client reads new work (hook ``lbs_reader``; set by :meth:`start`)."""
        return self._state.strategy

    @property
    def server_version(self) -> tuple[int, ...]:
        """The Redis version the server answers as, once started (``()`` before): what feature checks
        go by. Valkey 9.1 answers 7.2.4; :attr:`server_name` names it."""
        return self._state.server.version

    @property
    def server_name(self) -> str:
        """What the server is, for people, once started: "Redis 8.6.3", "Valkey 9.1.2" (``""`` before)."""
        return self._state.server.name

    @property
    def node(self) -> str:
        """``host:port`` of the master owning the LBS's slot (cluster only, once routed)."""
        return self._state.link.node

    @property
    def keyspace_events_configured(self) -> bool:
        """Whether ``notify-keyspace-events`` has the flags recovery's listener needs."""
        return self._life.topology.keyspace_events_configured

    # ------------------------------------------------------------- start ---

    async def start(self) -> None:
        """Create the group if needed, configure keyspace events, start reading.

        Idempotent. Raises :class:`lbs.RedisOperationError` if Redis is unreachable.
        """
        if self._life.started:
            return
        if self._life.closing is not None:
            raise ConfigurationError("a closed client cannot be started again")
        await self._life.start()

    async def check_server(self) -> bool:
        """Notice a server restart (its run id changed) and re-apply what it forgot; whether it restarted.

        ``notify-keyspace-events`` set with CONFIG SET does not survive a
        restart (unless the config file was rewritten), so it is set again.
        Called when the keyspace listener reconnects and by every scan.
        """
        return await self._life.topology.check_server()

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
        return await self._life.topology.reset()

    async def heartbeat(self) -> int:
        """Extend this consumer's lease now, in one round trip; return how many held streams were lost.

        One call extends the lease ``{<service>-input}:lease:<consumer id>``
        and moves the consumer's deadline, however many streams it holds.
        A lease found lapsed (a stall, an eviction, a partition) loses every
        held stream (each disowned: STREAM_DISOWNED); it is taken again, and
        what is still pending to this consumer is put back with no retry
        counted. The heartbeat task calls this every
        ``Config.heartbeat_every`` seconds.
        """
        return await self._heartbeat.tick()

    # --------------------------------------------------------------- done ---

    async def done_stream(self, stream: str, entry_id: str | None = None) -> DoneStatus:
        """Finish a data stream: ack and delete its entry and release its name, in one call.

        With several assignments of one name held, ``entry_id`` picks one (the
        oldest otherwise). Returns :class:`lbs.DoneStatus`: ``DONE``, or
        ``LOCK_LOST`` when the lease it was read under had lapsed (or the
        entry was no longer pending to this consumer): nothing was acked, and
        the stream may be processed twice. Raises :class:`lbs.NotHeldError`
        for a stream this client never held (or already finished). While
        Redis is unreachable (a dropped connection, a restart, a failover)
        the call is sent again with back-off, the lease kept alive meanwhile,
        until Redis answers; :class:`lbs.RedisOperationError` when Redis
        refuses it, or when the client closes first.
        """
        (h,) = self._state.holdings.to_finish([(stream, entry_id)])
        if h.start():  # finished without its notification ever taken: out of the queued set first
            await self._heartbeat.mark_running([h])
        (status,) = await self._finisher.finish([h])
        return status

    async def done_streams(self, streams: Iterable[str | Notification]) -> list[DoneStatus]:
        """:meth:`done_stream` for many streams in one round trip.

        Items are stream names or the STREAM_ADDED notifications themselves
        (which pin the entry id). Statuses come back in order. Raises
        :class:`lbs.NotHeldError` before touching Redis if any is not held.
        """
        if isinstance(streams, (str, bytes)):
            raise ConfigurationError(
                "done_streams takes a list of names or notifications, not one name"
            )
        picked = self._state.holdings.to_finish(
            (item.stream, item.entry_id) if isinstance(item, Notification) else (item, None)
            for item in streams
        )
        # Finished without its notification ever taken: out of the queued set first (nothing left behind).
        await self._heartbeat.mark_running([h for h in picked if h.start()])
        return await self._finisher.finish(picked)

    async def wait_finished(self, count: int, timeout: float | None = None) -> None:
        """Wait until ``stats.finished`` (streams finished, whatever the outcome) reaches ``count``.

        Raises :class:`asyncio.TimeoutError` after ``timeout`` seconds, and at once the error
        ``run()`` / ``run_keyed()`` died of (at start, e.g. a plugin refusing the server, or later).
        """
        await within(self._state.wait_finished(count), timeout)

    # ---------------------------------------------------------- hand-back ---

    async def hand_back(
        self,
        stream: str,
        entry_id: str | None = None,
        *,
        count_retry: bool = False,
        reason: str = "handed back",
        delay: float | None = None,
    ) -> str:
        """Give a held stream back to the LBS as a fresh entry, now or after ``delay`` seconds.

        With ``count_retry`` its ``_retry_count`` goes up, and past
        ``Config.max_retries`` it goes to the dead-letter stream instead (at
        once, whatever the delay). ``delay`` None means the retry back-off
        when ``count_retry`` is set (``Config.retry_delay`` doubling per
        retry up to ``retry_delay_max``, jittered; what a failed ``run()``
        handler gets) and at once otherwise; a number of seconds parks the
        stream that long (0: at once). A parked stream waits in Redis
        (``{<service>-input}:delayed``, due times in ``{<service>-input}:due``)
        and any started client brings it back when it is due, so it survives
        restarts. Returns the new entry id (for a parked stream, its id in
        the parking stream; "" when dead-lettered, dropped or already lost
        with the lease it was read under). Under :meth:`run`, the stream's handler is
        cancelled, and has ended, before the stream goes back (unless the
        handler itself is the caller), so this process never runs two
        handlers for one stream. Raises :class:`lbs.ConfigurationError` for
        a ``delay`` that is not a finite number >= 0 and
        :class:`lbs.NotHeldError` for a stream not held.
        """
        if delay is not None:
            require_number(
                delay, "delay must be None or a finite number of seconds >= 0", finite=True
            )
        holdings = self._state.holdings
        h = holdings.find(stream, entry_id)
        holdings.drop(h)
        task = h.task
        if task is not None and task is not asyncio.current_task() and not task.done():
            await cancel_and_wait([task])
        wait = delay if delay is not None else None if count_retry else 0.0
        return (
            await self._requeue.hand_back([h], count_retry=count_retry, reason=reason, delay=wait)
        )[0]

    async def claim(
        self, entry: str | Notification, *, force: bool = False, reason: str = ""
    ) -> bool:
        """Recover one assignment now if its holder's lease is gone (Go parity).

        ``entry`` is an LBS entry id or a notification carrying one. The
        assignment goes back to the LBS with one more retry counted (or to
        the dead-letter stream past ``max_retries``). Returns True if this
        call did it; False if the lease of the consumer it is pending to
        lives (the holder keeps it) or someone else already recovered it.
        ``force``: whatever its holder (``ServiceControls.force_claim``).
        """
        entry_id = entry.entry_id if isinstance(entry, Notification) else entry
        try:
            return await self._requeue.claim(entry_id, "any" if force else "absent", reason)
        except RedisError as exc:
            raise RedisOperationError("claim", exc) from exc

    # ------------------------------------------------------ notifications ---

    async def notifications(self) -> AsyncIterator[Notification]:
        """Notifications in order, until the client is closed.

        Meant for one consumer at a time. The buffer is bounded
        (``Config.notification_buffer``): while it is full the reader waits.
        """
        while (note := await self._handover.next()) is not None:
            yield note

    async def next_notification(self, timeout: float | None = None) -> Notification | None:
        """The next notification, or None when closed (or after ``timeout`` seconds). After ``run()`` died,
        raises what it died of."""
        try:
            note = await within(self._state.mailbox.get(), timeout)
        except asyncio.TimeoutError:
            return None
        return await self._handover.received(note)

    def drain_notifications(self, limit: int | None = None) -> list[Notification]:
        """The notifications already buffered (up to ``limit``), without waiting.

        For applications that work in batches: await one notification, then
        drain the rest and finish them together with :meth:`done_streams`.
        """
        return self._handover.drain(limit)

    # ---------------------------------------------------------------- run ---

    async def run(
        self,
        handler: Handler | None = None,
        concurrency: int | None = None,
        *,
        handle_signals: bool = True,
        timeout: float | None = None,
    ) -> None:
        """Call ``await handler(notification)`` for every assigned stream until closed.

        Without ``handler``, a plugin provides it (hook ``lbs_handler``).

        When the handler returns, the stream is finished as by
        :meth:`done_stream` (batched with every other stream finishing at
        the same time); when it raises, the stream is handed back with a
        retry counted, and comes back after the retry back-off
        (``Config.retry_delay``, doubling per retry up to
        ``Config.retry_delay_max``, jittered; kept in Redis, so it survives
        restarts), so a stream that always fails ends in the dead-letter
        stream. A handler running longer than ``timeout`` seconds (default
        ``Config.handler_timeout``; None there: no limit) is cancelled and
        its stream handed back the same way (``stats.handler_timeouts``;
        other failures count in ``stats.handler_failures``, every run time
        in ``stats.handler_seconds``). A disowned stream's handler is
        cancelled. At most ``concurrency`` handlers run at once (default
        ``Config.max_streams``), and ``concurrency`` is also the client's
        capacity (above ``max_streams`` too): the reader takes no more streams
        than there is room to run, half of that per read unless
        ``Config.read_count`` says otherwise.

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
        self._not_serving()
        runner = serving.runner(self._life, handler, timeout)
        await self._serve(runner.dispatch, concurrency, handle_signals)

    def _not_serving(self) -> None:
        if self._life.reader.dispatch is not None:
            raise ConfigurationError("run() is already running on this client")

    async def _serve(self, dispatch: Dispatch, concurrency: int | None, signals: bool) -> None:
        life = self._life
        await serving.serve(life, dispatch, concurrency, signals, self.start, self.notifications)

    async def run_keyed(
        self,
        handler: KeyedHandler,
        concurrency: int | None = None,
        *,
        batch: int = 100,
        max_hold_messages: int = 1000,
        max_hold_seconds: float = 5.0,
        linger: float = 5.0,
        handle_signals: bool = True,
    ) -> None:
        """Process keys published by :class:`lbs.Publisher`: each key's messages in order, one holder at a time.

        For every key this consumer takes, ``await handler(batch)`` gets a
        :class:`lbs.KeyedBatch`: up to ``batch`` of the key's messages after
        its committed position, in order, with the hold's fencing token and
        retry count. When the handler returns, the position moves past the
        batch (fenced: a holder that lost the key cannot move it) together
        with the batch's effects (:meth:`lbs.KeyedBatch.emit`), and the next
        messages come in the same round trip. A key found drained lingers,
        held and running nothing, for ``linger`` seconds (taking no slot of
        ``concurrency``): a message published meanwhile wakes this consumer
        (``SPUBLISH``), which runs it with no new registration, read or
        fetch, so quiet keys stay with their holders. Then (at once with
        ``linger=0``) it is let go, atomically with the check that none is
        left, so a message published at that moment registers it again.
        After ``max_hold_messages`` messages or ``max_hold_seconds`` a key
        that still has messages is yielded: it goes to the back of the LBS,
        so one hot key cannot starve the others.

        A handler that raises hands the key back with its position (its
        effects dropped), parked for the retry back-off; the failed batch is
        then taken apart, one message a hold up to its last message, so the
        messages before the culprit are committed once, and the culprit goes
        to the dead-letter stream once it has failed in 1 +
        ``Config.max_retries`` holds (at least one of them alone), with its
        fields, the reason, the exception and its traceback; the key goes on
        after it. A holder that dies (or stalls past its lease's TTL) leaves its
        key to recovery like any assignment, counted as a failed hold: the
        next holder resumes after the last committed message and writes its
        effects; the stalled one, if it comes back, writes none. At most
        ``concurrency`` keys are held at once (default
        ``Config.max_streams``). Signals and :meth:`close` work as for
        :meth:`run`; a handler they cut short counts no failure (its key is
        let go where it was).
        """
        self._not_serving()
        keyed = serving.keyed_runner(
            self._life, handler, batch, max_hold_messages, max_hold_seconds, linger
        )
        self._life.keyed = keyed
        try:
            await self._serve(keyed.dispatch, concurrency, handle_signals)
        finally:
            self._life.keyed = None
            await keyed.stop()

    # -------------------------------------------------------------- close ---

    async def close(self) -> None:
        """Stop reading, hand every held stream back to the LBS at once, and stop.

        Handed-back streams become fresh entries (no retry counted, names
        released), so another consumer gets them without waiting for the
        lease's TTL.
        Running ``run()`` handlers get ``Config.drain_timeout`` seconds to
        finish first. Idempotent and safe from any task: every call returns
        once the one shutdown has finished (cancelling a caller does not stop
        the shutdown).
        """
        await self._life.close()

    def __repr__(self) -> str:
        return f"<lbs.Client {self.id} service={self.service!r} held={self.held}>"

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
