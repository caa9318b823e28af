"""The activities of one client: built together, started in order, shut down in one fixed order.

:class:`lbs.Client` holds one :class:`Lifecycle` and asks it to start, close
and (for tests, :func:`lbs.testing.abandon`) die. Start: the topology (route,
group, server), the consumer's lease, the read strategy and dead-letter backend
from plugins, keyspace events, start-up recovery; then the activities. The
shutdown's order is the contract of ``close()``: stop reading and everything
that could take or move work, let handlers drain, send what keyed runners
committed, hand every held stream back, send queued finishes, stop the
heartbeat and the finisher, release the lease (and leave the group when nothing
is pending), close the connections.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from .._redis.connection import cancel_and_wait
from .._redis.wire import text
from ..exceptions import RedisOperationError
from ..strategy import ReadStrategy
from .activity import Activity
from .control import Controls
from .finisher import Finisher
from .forwarder import Forwarder
from .handover import Handover
from .heartbeat import Heartbeat
from .instance import Instance
from .observer import Observer
from .protocol import refuse_lock_protocol
from .reader import Reader
from .recovery import Recovery
from .requeue import Requeue
from .topology import Topology

if TYPE_CHECKING:
    from redis.asyncio.cluster import RedisCluster

    from _lbscore import Held

    from .keyed import KeyedRunner
    from .state import ClientState

__all__ = ["Lifecycle"]


class Lifecycle:
    """One client's activities and its start, shutdown and (for tests) death."""

    def __init__(self, state: ClientState, cluster: RedisCluster | None, owned: bool) -> None:
        s = self.state = state
        #: The cluster client given or opened (None on a single Redis), and whether it is ours to close.
        self.cluster, self.owned = cluster, owned
        self.topology = Topology(s, cluster)
        self.requeue = Requeue(s)
        self.finisher = Finisher(s, self.topology)
        self.heartbeat = Heartbeat(s, self.finisher, self.requeue, self.topology)
        #: The service's pause and the operators' orders about held streams.
        self.controls = Controls(s, self.requeue)
        self.reader = Reader(
            s, self.finisher, self.requeue, self.topology, self.heartbeat.cover, self.controls
        )
        self.instance = Instance(s)
        self.observer = Observer(s)
        self.recovery = Recovery(s, self.requeue, self.topology, self.instance.forget_departed)
        #: Dead letters to a plugin's backend (started when a plugin provides one).
        self.forwarder: Forwarder | None = None
        #: Under ``run_keyed()``: its runner, whose finished keys commit at shutdown.
        self.keyed: KeyedRunner | None = None
        #: The notifications on their way to the application.
        self.handover = Handover(s, self.heartbeat)
        self.started = False
        #: The start under way (a shutdown cancels it first), and whether it tried to take the marker.
        self.starting: asyncio.Future[None] | None = None
        self.took_instance = False
        #: The one shutdown every ``close()`` waits for (None until the first close).
        self.closing: asyncio.Future[None] | None = None
        #: Set by a second signal: stop waiting for handlers.
        self.drain_cut = asyncio.Event()

    def activities(self) -> list[Activity]:
        """Every activity with a task, in the order they start."""
        found: list[Activity | None] = [
            self.reader,
            self.heartbeat,
            self.controls,
            self.observer,
            self.recovery,
            self.requeue.delays,
            self.forwarder,
            self.finisher,
            self.keyed,
            self.state.journal,
        ]
        return [a for a in found if a is not None]

    async def start(self) -> None:
        """Start, in a task of its own that a shutdown cancels (a SIGTERM or ``close()`` while
        starting): then it returns, the client closed and nothing of it left behind (the instance
        marker included). Its own error, or the caller's cancellation, is raised."""
        task = self.starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not task.cancelled():
            task.result()

    async def _start(self) -> None:
        s = self.state
        cfg = s.config
        await self.topology.start()
        await refuse_lock_protocol(s)
        self.took_instance = True
        await self.instance.take()
        # Which reader: a plugin may answer (and may refuse this server by raising).
        strategy = s.hooks.ask("lbs_reader", server_version=s.server.version)
        s.strategy = strategy if strategy is not None else ReadStrategy(name="default")
        if s.strategy.claim_min_idle is not None:
            s.log.warning(
                "read strategy %r asks for XREADGROUP ... CLAIM of entries idle %gs: ignored. An entry "
                "is held while its consumer's lease lives, however idle, and recovery takes a dead "
                "consumer's entries as soon as its lease is gone (lbs-claim is no longer needed)",
                s.strategy.name,
                s.strategy.claim_min_idle,
            )
        backend = s.hooks.ask("lbs_dead_letter_backend") if s.names.dead_letter_key else None
        self.forwarder = Forwarder(s, backend) if backend is not None else None
        if cfg.configure_keyspace_events:
            await self.topology.keep_keyspace_events()
        if cfg.recovery:
            try:
                await self.recovery.startup()
            except RedisError as exc:
                s.log.warning("startup recovery failed (%s); the scan will cover it", exc)
        self.started = True
        # The first tick puts this consumer in the deadline index before it reads anything: a death
        # from here on is found by the deadline poller, not only by the scan.
        await self.heartbeat.tick()
        await self.controls.look()  # a paused service: the reader waits from its first read
        self.reader.start()
        self.heartbeat.start()
        self.controls.start()
        self.observer.start()
        if cfg.recovery:
            self.recovery.start()
        self.requeue.delays.start()
        if self.forwarder is not None:
            self.forwarder.start()
        s.log.info(
            "started on %s (group %s, %s)",
            s.names.stream_key,
            s.names.group,
            s.server.name or "Redis " + (".".join(map(str, s.server.version)) or "?"),
        )
        s.hooks.notify("lbs_client_started")
        s.journal.start()  # after the plugins started: its `started` event has lbs_process_info's answers

    def begin_close(self) -> asyncio.Future[None]:
        """The one shutdown, started by the first call."""
        if self.closing is None:
            self.closing = asyncio.ensure_future(self.shutdown())
        return self.closing

    async def close(self) -> None:
        """:meth:`begin_close`, and wait for it (shielded: cancelling a caller does not stop it)."""
        await asyncio.shield(self.begin_close())

    async def shutdown(self) -> None:
        s = self.state
        cfg = s.config
        if self.starting is not None and not self.starting.done():
            self.starting.cancel()  # what it started is stopped below, like the rest
            await asyncio.wait({self.starting})
        s.stopping.set()
        s.holdings.freed.set()
        # Undelivered STREAM_ADDED notifications are dropped: their streams are
        # held, so they are handed back below. A reader waiting to deliver one
        # is released at once.
        s.mailbox.close(discard=True)
        await self.reader.stop()
        await self.controls.stop()
        await self.observer.stop()
        await self.recovery.stop()
        await self.requeue.delays.stop()
        if self.forwarder is not None:
            await self.forwarder.stop()
        running = [t for t in s.handlers if not t.done()]
        if running and cfg.drain_timeout > 0:
            # Until every handler ended, the drain time is up, or a second signal cuts it short.
            ended = asyncio.ensure_future(asyncio.wait(running))
            cut = asyncio.ensure_future(self.drain_cut.wait())
            await asyncio.wait(
                [ended, cut], timeout=cfg.drain_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in (ended, cut):
                waiter.cancel()
        await cancel_and_wait(running)
        # drain_notifications' marks: the streams go back below
        await cancel_and_wait(list(self.handover.marking))
        if self.keyed is not None:
            # Keys whose handlers finished commit (and yield) first; the rest are handed back below.
            await self.keyed.flush(cfg.read_block + 5.0)
        handed = s.holdings.table.values()
        for h in handed:
            s.holdings.drop(h)
        handed_back = await self._hand_back(handed)
        # Streams whose handlers finished are queued for done-n.lua: send them.
        await self.finisher.drain(cfg.read_block + 5.0)
        await self._put_back_untracked()
        await self.heartbeat.stop()
        await self.finisher.stop()
        await s.journal.close(handed_back)
        if self.took_instance:  # leave-3.lua deletes the lease only if it is this process's
            await self.instance.release()
        await s.link.close(s.log)
        s.log.info("closed; handed back %d streams", handed_back)
        s.hooks.notify("lbs_client_closed", handed_back=handed_back)
        await self._close_clients()

    async def _hand_back(self, handed: list[Held]) -> int:
        s = self.state
        try:
            results = await self.requeue.hand_back(
                handed, count_retry=False, reason=f"{s.names.id} shut down"
            )
            return sum(1 for r in results if r)
        except RedisOperationError as exc:
            s.hooks.metric("hand_back_failures_total", len(handed))
            s.log.error(
                "hand-back on close failed (%s); %d streams stay pending to this consumer and go "
                "back once its lease expires",
                exc,
                len(handed),
            )
            return 0

    async def _put_back_untracked(self) -> None:
        """At close, once handed back and drained: what is still pending to this consumer and no longer
        tracked (a read the stop cut between its ``XREADGROUP`` and its take; streams disowned when
        the lease lapsed whose put-back the heartbeat had not sent) goes back now, no retry counted,
        rather than wait for another consumer's recovery once the lease expires. Under the lease
        while it holds this process's value, else only while it is gone (never under another
        process's lease on the same consumer id)."""
        s = self.state
        try:
            tracked = self.heartbeat.tracked()
            stray = [i for i in await self.heartbeat.own_pending() if i not in tracked]
            if not stray:
                return
            held = await s.link.redis.get(s.names.lease_key)
            if held is not None and text(held) != s.lease.value:
                return  # another process runs under this consumer id: they are its streams
            mode = "absent" if held is None else "owned"
            back = await self.requeue.lost_while_alive(stray, f"{s.names.id} shut down", mode=mode)
            s.log.info(
                "closing: put back %d of %d streams pending to this consumer and no longer held",
                back,
                len(stray),
            )
        except (RedisError, RedisOperationError) as exc:
            s.log.warning(
                "closing: looking for streams still pending to this consumer failed (%s); they go "
                "back once its lease expires",
                exc,
            )

    async def _close_clients(self) -> None:
        s = self.state
        if self.cluster is not None:
            await s.link.redis.aclose()  # our client of the slot owner
            if self.owned:
                await self.cluster.aclose()
        elif self.owned:
            await s.link.redis.aclose()

    async def abandon(self) -> None:
        """End as if the process were killed: every task stops, the connections close, and nothing
        is handed back, finished or released (the lease, pending entries and deadline stay in Redis
        until the lease expires and recovery takes them). ``close()`` then does no more."""
        s = self.state
        s.stopping.set()  # a handler that ends now leaves its stream as it is (see Runner._ended)
        if self.closing is None:
            self.closing = asyncio.get_running_loop().create_future()
            self.closing.set_result(None)
        s.mailbox.close(discard=True)
        tasks = [t for a in self.activities() for t in a.running()]
        await cancel_and_wait([*tasks, *s.handlers, *self.handover.marking])
        await s.link.close(s.log)
        await self._close_clients()

    async def freeze(self) -> None:
        """Stop reading and heartbeating, nothing more: a stalled process, or one cut off from Redis
        (its lease lapses; its connections stay open, so it can still be closed)."""
        await self.heartbeat.stop()
        await cancel_and_wait([self.reader.task])
