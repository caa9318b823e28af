"""The consumer's facade: :class:`Client` starts, stops and answers; its activities do the work.

Per client, whatever the number of held streams (see lbs._consumer):

* the **reader** reads and locks batches (``read-3.lua``) up to the free
  capacity and hands each stream to ``run()``'s handlers or the
  notification mailbox;
* the **heartbeat** extends every held lock in one round trip per tick;
* the **finisher** batches every ``done_stream`` into one ``done-n.lua`` call;
* **recovery** brings dead consumers' streams back (deadline poller,
  keyspace listener, scan); **requeue** is every hand-back and re-queue.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import uuid
from collections.abc import AsyncIterator, Iterable

import pluggy
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from _lbscore import Held

from . import _keys
from ._consumer.finisher import Finisher
from ._consumer.forwarder import Forwarder
from ._consumer.heartbeat import Heartbeat
from ._consumer.instance import Instance
from ._consumer.keyed import KeyedRunner
from ._consumer.observer import Observer
from ._consumer.reader import Dispatch, Reader
from ._consumer.recovery import Recovery
from ._consumer.requeue import Requeue
from ._consumer.runner import SIGNALS, Handler, Runner
from ._consumer.state import ClientStats, ConsumerLog, ConsumerState, Names, consumer_id_from_env
from ._consumer.topology import Topology
from ._redis.connection import ClusterMode, RedisLike, cancel_and_wait, resolve_client
from ._waits import within
from .config import Config
from .exceptions import ConfigurationError, LbsError, NotHeldError, RedisOperationError
from .keyed import KeyedHandler
from .notifications import DoneStatus, Notification, NotificationType
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
        #: This process's instance nonce: lock values are "<token>:<id>:<instance>", so a
        #: process adopts only its own locks, and a second live process with the same
        #: consumer id is refused at start (the marker ``{<service>-input}:instance:<id>``).
        self.instance = uuid.uuid4().hex[:12]
        names = Names.of(self.service, self.id, self.instance, self.config)
        self.lock_owner = names.lock_owner
        self.stream_key = names.stream_key
        self.group = names.group
        self.fence_key = names.fence_key
        self.consumers_key = names.consumers_key
        self.instance_key = names.instance_key
        self.dead_letter_key = names.dead_letter_key
        source, self._owned = resolve_client(redis, cluster=cluster)
        cluster_client = source if isinstance(source, RedisCluster) else None
        if cluster_client is not None and self.config.go_compatible:  # (nothing connected yet)
            raise ConfigurationError(
                "Config.go_compatible needs a single Redis: the Go reference client's "
                "lock keys have no hash tag, so they are in other slots than the LBS"
            )
        self.log = ConsumerLog(log, {"consumer_id": self.id})
        self._hooks = Hooks(self.pm, self, {"service": self.service, "consumer": self.id}, self.log)
        self._state = s = ConsumerState(
            self.config, names, self._hooks, self.log, Topology.first_link(source), self
        )
        self._cluster = cluster_client
        self._topology = Topology(s, cluster_client)
        self._requeue = Requeue(s)
        self._finisher = Finisher(s, self._topology)
        self._heartbeat = Heartbeat(s, self._finisher, self._requeue, self._topology)
        self._marking: set[asyncio.Task[None]] = set()  # drain_notifications' marks, on their way
        self._reader = Reader(s, self._finisher, self._requeue, self._topology)
        self._keyed: KeyedRunner | None = None
        self._instance = Instance(s)
        self._observer = Observer(s)
        self._forwarder: Forwarder | None = None
        #: The recovery tasks (deadline poller, keyspace listener, scan); see lbs._consumer.recovery.
        self.recovery = Recovery(
            s, self._requeue, self._topology, self._reader, self._instance.forget_departed
        )
        #: Counters of what this client did (cheap, always on).
        self.stats = s.stats
        self._started = False
        self._closed = False
        self._closing: asyncio.Future[None] | None = (
            None  # the one shutdown every close() waits for
        )
        self._drain_cut = asyncio.Event()  # a second signal: stop waiting for handlers

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
        """The server's version, once started (``()`` before)."""
        return self._state.server.version

    @property
    def node(self) -> str:
        """``host:port`` of the master owning the LBS's slot (cluster only, once routed)."""
        return self._state.link.node

    @property
    def keyspace_events_configured(self) -> bool:
        """Whether ``notify-keyspace-events`` has the flags recovery's listener needs."""
        return self._topology.keyspace_events_configured

    # ------------------------------------------------------------- start ---

    async def start(self) -> None:
        """Create the group if needed, configure keyspace events, start reading.

        Idempotent. Raises :class:`lbs.RedisOperationError` if Redis is unreachable.
        """
        if self._started:
            return
        if self._closed:
            raise ConfigurationError("a closed client cannot be started again")
        s = self._state
        await self._topology.start()
        await self._instance.claim()
        # Which reader: a plugin may answer (and may refuse this server by raising).
        strategy = self._hooks.ask("lbs_reader", server_version=s.server.version)
        s.strategy = strategy if strategy is not None else ReadStrategy(name="default")
        backend = self._hooks.ask("lbs_dead_letter_backend") if self.dead_letter_key else None
        self._forwarder = Forwarder(s, backend) if backend is not None else None
        if self.config.configure_keyspace_events:
            await self._topology.keep_keyspace_events()
        if self.config.recovery:
            try:
                await self.recovery.startup()
            except RedisError as exc:
                self.log.warning("startup recovery failed (%s); the scan will cover it", exc)
        self._started = True
        self._reader.start()
        self._heartbeat.start()
        self._observer.start()
        if self.config.recovery:
            self.recovery.start()
        self._requeue.delays.start()
        if self._forwarder is not None:
            self._forwarder.start()
        self.log.info(
            "started on %s (group %s, %s)",
            self.stream_key,
            self.group,
            s.server.name or "Redis " + (".".join(map(str, s.server.version)) or "?"),
        )
        self._hooks.notify("lbs_client_started")

    async def check_server(self) -> bool:
        """Notice a server restart (its run id changed) and re-apply what it forgot; whether it restarted.

        ``notify-keyspace-events`` set with CONFIG SET does not survive a
        restart (unless the config file was rewritten), so it is set again.
        Called when the keyspace listener reconnects and by every scan.
        """
        return await self._topology.check_server()

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
        return await self._topology.reset()

    async def heartbeat(self) -> int:
        """Extend every held lock now, in one round trip; return how many were lost.

        Every lock is extended; the pending idle time is refreshed for a
        rotating share of the entries (``Config.pel_refresh_every``). The
        locks go in script calls of ``Config.heartbeat_chunk``, each written
        as soon as it is encoded. The heartbeat task calls this every
        ``Config.heartbeat_every`` seconds.
        """
        return await self._heartbeat.tick()

    # --------------------------------------------------------------- done ---

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
        the parking stream; "" when dead-lettered, dropped or the lock was
        already lost). Under :meth:`run`, the stream's handler is
        cancelled, and has ended, before the stream goes back (unless the
        handler itself is the caller), so this process never runs two
        handlers for one stream. Raises :class:`lbs.ConfigurationError` for
        a ``delay`` that is not a finite number >= 0 and
        :class:`lbs.NotHeldError` for a stream not held.
        """
        if delay is not None and (
            not isinstance(delay, (int, float))
            or isinstance(delay, bool)
            or not math.isfinite(delay)
            or delay < 0
        ):
            raise ConfigurationError(
                f"delay must be None or a finite number of seconds >= 0, got {delay!r}"
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
            return await self._requeue.claim(entry_id)
        except RedisError as exc:
            raise RedisOperationError("claim", exc) from exc

    # ------------------------------------------------------ notifications ---

    async def notifications(self) -> AsyncIterator[Notification]:
        """Notifications in order, until the client is closed.

        Meant for one consumer at a time. The buffer is bounded
        (``Config.notification_buffer``): while it is full the reader waits.
        """
        mailbox = self._state.mailbox
        while True:
            note = await mailbox.get()
            if note is None:
                self._raise_failure()
                return
            await self._hand_over([note])
            yield note

    def _raise_failure(self) -> None:
        """The error ``run()`` died of, raised (closed without one: nothing)."""
        if self._state.failure is not None:
            raise self._state.failure

    async def next_notification(self, timeout: float | None = None) -> Notification | None:
        """The next notification, or None when closed (or after ``timeout`` seconds). After ``run()`` died,
        raises what it died of."""
        try:
            note = await within(self._state.mailbox.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if note is not None:
            await self._hand_over([note])
        else:
            self._raise_failure()
        return note

    def drain_notifications(self, limit: int | None = None) -> list[Notification]:
        """The notifications already buffered (up to ``limit``), without waiting.

        For applications that work in batches: await one notification, then
        drain the rest and finish them together with :meth:`done_streams`.
        """
        mailbox = self._state.mailbox
        out: list[Notification] = []
        while (limit is None or len(out) < limit) and len(mailbox):
            note = mailbox.get_nowait()
            if note is None:
                break
            out.append(note)
        if started := self._taken(out):
            # Not awaited (this call does not wait): Redis is told at once, in the background.
            task = asyncio.create_task(self._heartbeat.mark_running(started))
            self._marking.add(task)
            task.add_done_callback(self._marking.discard)
        return out

    def _taken(self, notes: list[Notification]) -> list[Held]:
        """The application took ``notes`` out of the queue: their streams run from now on (a death of
        this process counts against them, as a failed attempt). The records Redis has to be told of."""
        table = self._state.holdings.table
        out = []
        for note in notes:
            if note.type is NotificationType.STREAM_ADDED:
                h = table.get(note.entry_id)
                if h is not None and h.start():
                    out.append(h)
        return out

    async def _hand_over(self, notes: list[Notification]) -> None:
        """:meth:`_taken`, and Redis told before the application gets them."""
        if started := self._taken(notes):
            await self._heartbeat.mark_running(started)

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
        if self._reader.dispatch is not None:
            raise ConfigurationError("run() is already running on this client")
        if handler is None:
            handler = self._hooks.ask("lbs_handler")
            if handler is None:
                raise ConfigurationError(
                    "run() needs a handler: pass one, or install a plugin that "
                    "implements the lbs_handler hook"
                )
        if not callable(handler):
            raise ConfigurationError(
                f"run() needs a callable handler, got {type(handler).__name__}"
            )
        if timeout is None:
            timeout = self.config.handler_timeout
        elif (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or math.isnan(timeout)
            or timeout <= 0
        ):
            raise ConfigurationError(
                f"timeout must be None or a number of seconds > 0, got {timeout!r}"
            )
        limit = timeout if timeout is not None and math.isfinite(timeout) else None  # inf: no limit
        runner = Runner(self._state, self._finisher, self._requeue, handler, limit)
        await self._serve(runner.dispatch, concurrency, handle_signals)

    async def run_keyed(
        self,
        handler: KeyedHandler,
        concurrency: int | None = None,
        *,
        batch: int = 100,
        max_hold_messages: int = 1000,
        max_hold_seconds: float = 5.0,
        handle_signals: bool = True,
    ) -> None:
        """Process keys published by :class:`lbs.Publisher`: each key's messages in order, one holder at a time.

        For every key this consumer takes, ``await handler(batch)`` gets a
        :class:`lbs.KeyedBatch`: up to ``batch`` of the key's messages after
        its committed position, in order, with the hold's fencing token and
        retry count. When the handler returns, the position moves past the
        batch (fenced: a holder that lost the key cannot move it) together
        with the batch's effects (:meth:`lbs.KeyedBatch.emit`), and the next
        messages come in the same round trip; when none are left the key is
        let go, atomically with that check, so a message published at that
        moment registers it again. After ``max_hold_messages`` messages or
        ``max_hold_seconds`` a key that still has messages is yielded: it goes
        to the back of the LBS, so one hot key cannot starve the others.

        A handler that raises hands the key back with its position (its
        effects dropped), parked for the retry back-off; the failed batch is
        then taken apart, one message a hold up to its last message, so the
        messages before the culprit are committed once, and the culprit goes
        to the dead-letter stream once it has failed in 1 +
        ``Config.max_retries`` holds (at least one of them alone), with its
        fields, the reason, the exception and its traceback; the key goes on
        after it. A holder that dies (or stalls past its lock TTL) leaves its
        key to recovery like any assignment, counted as a failed hold: the
        next holder resumes after the last committed message and writes its
        effects; the stalled one, if it comes back, writes none. At most
        ``concurrency`` keys are held at once (default
        ``Config.max_streams``). Signals and :meth:`close` work as for
        :meth:`run`; a handler they cut short counts no failure (its key is
        let go where it was).
        """
        if self._reader.dispatch is not None:
            raise ConfigurationError("run() is already running on this client")
        if not callable(handler):
            raise ConfigurationError(
                f"run_keyed() needs a callable handler, got {type(handler).__name__}"
            )
        for name, value in (("batch", batch), ("max_hold_messages", max_hold_messages)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"{name} must be an integer of at least 1, got {value!r}")
        if (
            not isinstance(max_hold_seconds, (int, float))
            or isinstance(max_hold_seconds, bool)
            or not max_hold_seconds > 0
        ):
            raise ConfigurationError(
                f"max_hold_seconds must be a number > 0, got {max_hold_seconds!r}"
            )
        keyed = KeyedRunner(
            self._state,
            self._finisher,
            handler,
            batch=batch,
            max_hold_messages=max_hold_messages,
            max_hold_seconds=float(max_hold_seconds),
        )
        self._keyed = keyed
        try:
            await self._serve(keyed.dispatch, concurrency, handle_signals)
        finally:
            self._keyed = None
            await keyed.close()

    async def _serve(
        self, dispatch: Dispatch, concurrency: int | None, handle_signals: bool
    ) -> None:
        """Hand every taken stream to ``dispatch`` until closed (``run()`` and ``run_keyed()``)."""
        if concurrency is not None and (
            not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1
        ):
            raise ConfigurationError(
                f"concurrency must be an integer of at least 1, got {concurrency!r}"
            )
        s = self._state
        loop = asyncio.get_running_loop()
        self._reader.dispatch = dispatch
        s.capacity = s.run_limit = (
            concurrency if concurrency is not None else self.config.max_streams
        )
        catching = handle_signals and SIGNALS.catch(loop, self._on_signal)
        try:
            await self.start()
            # STREAM_ADDED goes straight to the runner; the other notifications
            # (disowned, expired, terminated) are drained so they never fill the box.
            async for _ in self.notifications():
                pass
            if s.handlers:
                await asyncio.gather(*s.handlers, return_exceptions=True)
            if self._closing is not None:
                await asyncio.shield(self._closing)  # close() ran elsewhere: return once it is over
        except Exception as exc:
            # Nothing waits forever on a worker that is gone: wait_finished() and the notifications raise it.
            # lbs's own errors say what went wrong in their message (the caller gets them too); anything
            # else keeps its traceback.
            self.log.error("run() failed: %s", exc, exc_info=not isinstance(exc, LbsError))
            s.fail(exc)
            raise
        finally:
            if catching:
                SIGNALS.release(loop, self._on_signal)
            self._reader.dispatch = None
            s.run_limit, s.capacity = 0, self.config.max_streams

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._closing is None:
            self.log.warning(
                "%s: stopping (drain %.1fs, then hand back)", sig.name, self.config.drain_timeout
            )
            asyncio.ensure_future(self.close())
        else:
            self.log.warning("%s again: handing back without waiting for handlers", sig.name)
            self._drain_cut.set()

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
        s = self._state
        s.stopping.set()
        s.holdings.capacity.set()
        # Undelivered STREAM_ADDED notifications are dropped: their streams are
        # held, so they are handed back below. A reader waiting to deliver one
        # is released at once.
        s.mailbox.close(discard=True)
        await self._reader.stop()
        await self._observer.stop()
        await self.recovery.stop()
        await self._requeue.delays.stop()
        if self._forwarder is not None:
            await self._forwarder.stop()
        running = [t for t in s.handlers if not t.done()]
        if running and self.config.drain_timeout > 0:
            # Until every handler ended, the drain time is up, or a second signal cuts it short.
            ended = asyncio.ensure_future(asyncio.wait(running))
            cut = asyncio.ensure_future(self._drain_cut.wait())
            await asyncio.wait(
                [ended, cut], timeout=self.config.drain_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in (ended, cut):
                waiter.cancel()
        await cancel_and_wait(running)
        await cancel_and_wait(
            list(self._marking)
        )  # drain_notifications' marks: the streams go back below
        if self._keyed is not None:
            # Keys whose handlers finished commit (and yield) first; the rest are handed back below.
            await self._keyed.flush(self.config.read_block + 5.0)
        handed = s.holdings.table.values()
        for h in handed:
            s.holdings.drop(h)
        handed_back = 0
        try:
            results = await self._requeue.hand_back(
                handed, count_retry=False, reason=f"{self.id} shut down"
            )
            handed_back = sum(1 for r in results if r)
        except RedisOperationError as exc:
            self._hooks.metric("hand_back_failures_total", len(handed))
            self.log.error(
                "hand-back on close failed (%s); %d locks will expire instead", exc, len(handed)
            )
        # Streams whose handlers finished are queued for done-n.lua: send them.
        await self._finisher.drain(self.config.read_block + 5.0)
        await self._heartbeat.stop()
        await self._finisher.stop()
        if self._started:
            await self._instance.release()
        await s.link.close(self.log)
        self.log.info("closed; handed back %d streams", handed_back)
        self._hooks.notify("lbs_client_closed", handed_back=handed_back)
        if self._cluster is not None:
            await s.link.redis.aclose()  # our client of the slot owner
            if self._owned:
                await self._cluster.aclose()
        elif self._owned:
            await s.link.redis.aclose()

    async def __aenter__(self) -> Client:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<lbs.Client {self.id} service={self.service!r} held={self.held}>"
