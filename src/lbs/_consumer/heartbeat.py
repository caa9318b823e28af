"""The heartbeat: every held lock extended in one round trip per tick, whatever their number.

Each tick (every ``Config.heartbeat_every``, a quarter of that after a
failed one) extends the locks of the held streams and of those the finisher
has not had answered yet, refreshes the pending idle time of a rotating
share of their entries, and, in its last ``extend-n.lua`` call, moves this
consumer's deadline and refreshes its instance marker. A lock found lost
while its holder lives (a stall, an eviction) disowns the stream and puts it
back with no retry counted. The tick also warns of streams held past
``Config.hold_warning`` and retries dead letters that could not be written.

The heartbeat runs until the client's shutdown stops it, after the drain
and the hand-back: a stream whose handler still runs while ``close()``
drains stays held, however long the drain is beside the lock TTL.

**The local lease** covers every lock this client holds: until when (on the
client's monotonic clock) each is surely ours whatever the network does. A
tick that Redis answered renews it to the tick's send time plus the TTL
(less a margin); a stream taken since is covered from the send time of the
write that took it (:meth:`Heartbeat.cover`): Redis set its lock no earlier.
A reply read too late to run its entries (a frozen process: SIGSTOP, a long
pause, a starved VM, whose blocking read Redis answered meanwhile) is refused
there, before any handler starts; one that leaves less than a tick's
interval gets a tick at once. When the lease runs out every held stream is
disowned at that moment, its handler cancelled.

Beside a Go fleet (``Config.go_compatible``) the same calls keep a Go-style
lock beside each of ours (``max(lock_ttl, 4 s)``, so a dead lbs consumer's
streams outlive Go's 2-s claim idle); a stream whose Go-style lock holds
another name was taken by a Go consumer: extend-n deletes our lock and does
not refresh the entry's idle time (which would XCLAIM it back), and the
stream is disowned and counted (``go_taken_total``).
"""

from __future__ import annotations

import asyncio
import math
import time

from redis.exceptions import RedisError

from _lbscore import CommandBatch, Held, HeldTable

from .. import _keys
from .._redis import scripts
from .._redis.wire import first_error, text
from .._waits import wait_set, within
from ..config import GO_MIN_IDLE
from ..exceptions import RedisOperationError
from ..notifications import Notification, NotificationType
from .activity import Activity
from .finisher import Finisher
from .requeue import Requeue
from .state import ClientState
from .topology import Topology

__all__ = ["Heartbeat"]

#: Entry ids per SREM that takes streams out of the queued set.
MARK_SLICE = 5_000


class Heartbeat(Activity, kind="heartbeat"):
    """The heartbeat task of one client; the one caller of ``extend-n.lua``."""

    def __init__(
        self, state: ClientState, finisher: Finisher, requeue: Requeue, topology: Topology
    ) -> None:
        self.state, self.finisher, self.requeue, self.topology = state, finisher, requeue, topology
        #: Ticks so far: picks which entries refresh their pending idle time.
        self.beats = 0
        self._overdue_warned: set[str] = set()  # entry ids reported as held past hold_warning
        self._overdue_next = 0.0  # when the tick looks for them again (monotonic)
        #: The local lease: until when (monotonic) the locks are ours for sure, whatever the network
        #: does: the send time of the last tick Redis answered (or of the start) plus the lock TTL,
        #: less a margin. A lock Redis set then expires no earlier (it counts from when it ran).
        self.lease_until = time.monotonic() + self._lease()
        #: Streams disowned when the lease ran out, put back (no retry counted) by the next tick that
        #: reaches Redis: their holder lives, so no deadline will send anyone for them soon.
        self._orphans: list[Held] = []
        #: Fires at ``lease_until`` whatever the ticks are doing (a cut-off round trip may take long to give up).
        self._lease_timer: asyncio.TimerHandle | None = None
        #: The earliest lease end of the streams taken since the running (or last) tick's snapshot:
        #: that tick did not extend their locks, so its answer renews the lease no further than this.
        self._uncovered = math.inf
        #: Set to send the next tick at once (a stream taken with less than an interval of lease left).
        self.tick_now = asyncio.Event()
        #: When the next tick is due (monotonic).
        self.next_tick = 0.0

    async def stop(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        await super().stop()

    def _renew(self, until: float) -> None:
        """The locks are ours until ``until`` (monotonic): (re)arm the lease timer."""
        self.lease_until = until
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        loop = asyncio.get_running_loop()
        # The loop's clock is time.monotonic() (asyncio's default); the timer fires at the lease's end.
        self._lease_timer = loop.call_at(
            loop.time() + max(0.0, until - time.monotonic()), self._lease_expired
        )

    def _lease(self) -> float:
        """How long a confirmed lock is surely ours: the TTL less a margin for clock drift (5 %, at most 1 s)."""
        ttl = self.state.config.lock_ttl
        return ttl - min(0.05 * ttl, 1.0)

    def min_left(self) -> float:
        """The least lease a stream must have left to be started: a quarter of a tick's interval, the
        wait before a failed tick's retry (one round trip for a tick sent at once)."""
        return self.state.config.heartbeat_every / 4

    def cover(self, sent: float) -> bool:
        """Streams taken by a write sent at ``sent`` (monotonic; Redis set their locks no earlier, for a
        TTL): bring them under the local lease. False, and nothing changed, when less than
        :meth:`min_left` of that is left: the reply was read too late (the process was frozen while
        Redis answered), another consumer may already run them, and none may start here."""
        until = sent + self._lease()
        if until - time.monotonic() < self.min_left():
            return False
        self._uncovered = min(self._uncovered, until)
        if until < self.lease_until:
            self._renew(until)
            if until < self.next_tick + self.min_left():
                self.tick_now.set()  # the next tick would come too late for them: tick now
        return True

    async def _main(self) -> None:
        s = self.state
        every = s.config.heartbeat_every
        wait = every
        self._renew(time.monotonic() + self._lease())
        # Until stop(), which the shutdown calls once nothing is held any more: a drain keeps its locks.
        while True:
            self.next_tick = time.monotonic() + wait
            await wait_set(self.tick_now, wait)
            self.tick_now.clear()
            sent = time.monotonic()
            try:
                # A round trip that does not answer in time is abandoned (its connection dropped): a tick
                # waits at most an interval, and never past the lease.
                limit = (
                    max(0.01, min(every, self.lease_until - sent))
                    if self.state.holdings.table
                    else every
                )
                await within(self.tick(), limit)
                # The streams taken since the tick's snapshot keep the lease their take gave them;
                # when that ends before the next tick would, the next tick goes at once.
                self._renew(min(sent + self._lease(), self._uncovered))
                soon = self._uncovered - time.monotonic() < every + self.min_left()
                wait = 0.0 if soon else every
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, asyncio.TimeoutError):
                    exc = RedisOperationError(
                        "heartbeat", TimeoutError(f"no answer within {limit:.2f}s")
                    )
                s.hooks.metric("heartbeat_failures_total", 1)
                await self.topology.after_failure(exc)
                # The Wire already tried a fresh connection; try again soon, well
                # before the locks (extended at most a tick ago) can expire.
                wait = every / 4
                s.log.warning("heartbeat failed: %s; next try in %.2fs", exc, wait)

    def _lease_expired(self) -> None:
        """No tick confirmed the locks for a lock TTL (a partition, a stalled server): they may have
        expired and another consumer may take the streams at any moment. Disown every held stream
        here and now (handlers cancelled, STREAM_DISOWNED), before anyone else can start them."""
        s = self.state
        self._lease_timer = None
        # While close() drains too: a handler must not outlive its lock.
        held = [h for h in s.holdings.table.values() if s.holdings.drop(h)]
        if not held:
            return
        s.hooks.metric("lease_expired_total", len(held))
        s.log.error(
            "no heartbeat reached Redis for %.1fs (the lock TTL, less a margin): disowning the %d streams "
            "held, whose locks may be expiring",
            self._lease(),
            len(held),
        )
        for h in held:
            self._disown(
                h,
                "lease expired: no heartbeat confirmed the lock for a lock TTL (cut off from Redis?)",
            )
        self._orphans += held

    async def tick(self) -> int:
        """Extend every held lock now, in one round trip; return how many were lost (``Client.heartbeat``)."""
        s = self.state
        n, cfg = s.names, s.config
        table = s.holdings.table
        snapshot = table.values()
        self._uncovered = math.inf  # every stream taken so far is in this tick
        held = len(snapshot)
        finishing = self.finisher.finishing()
        if finishing:  # still ours until Redis answers their done: keep them alive
            snapshot += finishing
        started = time.perf_counter()
        chunk = cfg.heartbeat_chunk
        # At least one call, even holding nothing: it keeps the instance marker alive (one live process
        # per consumer id; the marker lives a lock TTL) and this consumer's deadline fresh, so an idle
        # client still ticks every heartbeat_every: a rarer idle tick would leave a read made just
        # after it with less than one failed tick of margin before the lease runs out.
        starts = range(0, max(1, len(snapshot)), chunk)
        sha, ttl = scripts.EXTEND.sha, cfg.lock_ttl_ms
        head_keys = scripts.extend_head(n.stream_key, n.consumers_key, n.instance_key)
        head_args = scripts.extend_args(ttl, n.group, n.id, False, n.instance)
        last_args = scripts.extend_args(ttl, n.group, n.id, True, n.instance)
        encode = table.encode_extend
        every = cfg.pel_refresh_every
        phase = self.beats % every
        self.beats += 1
        # Beside a Go fleet, each call also keeps our Go-style locks (they outlive Go's 2-s claim idle).
        go_sep = _keys.GO_MUTEX_KEY_SEP if cfg.go_compatible else None
        go_ttl = max(ttl, int(GO_MIN_IDLE * 1000))

        def build(b: CommandBatch, k: int) -> None:
            start = starts[k]
            encode(
                b,
                sha,
                head_keys,
                last_args if k == len(starts) - 1 else head_args,
                snapshot,
                start,
                min(start + chunk, len(snapshot)),
                every,
                phase,
                go_sep,
                go_ttl,
            )

        try:
            # Extending a lock checks its value first: sending a tick twice is harmless.
            results = first_error(
                await s.link.beat.execute_chunks(len(starts), build, retry_safe=True)
            )
        except RedisError as exc:
            raise RedisOperationError("heartbeat", exc) from exc
        s.stats.heartbeats += 1
        s.stats.heartbeat_at = time.monotonic()
        await self.mark_running(snapshot)  # marks a take could not send (none, nearly always)
        lost: list[Held] = []
        for start, positions in zip(starts, results):
            for p in positions:
                if not isinstance(p, int):
                    self._warn(text(p))
                elif p > 0:
                    lost.append(snapshot[start + p - 1])
                elif s.holdings.drop(
                    h := snapshot[start - p - 1]
                ):  # a Go consumer took it: ours deleted
                    s.hooks.metric("go_taken_total", 1)
                    self._disown(h, "a Go consumer took it (its Go-style lock holds another name)")
        settling = s.holdings.settling  # let go by a keyed commit in flight, not lost
        lost = [h for h in lost if h.entry_id not in settling and s.holdings.drop(h)]
        for h in lost:
            self._disown(h, "lock expired or taken while held (heartbeat missed)")
        if held:  # a tick holding nothing only kept the instance marker alive
            s.hooks.notify(
                "lbs_locks_extended",
                extended=held - len(lost),
                lost=len(lost),
                seconds=time.perf_counter() - started,
            )
        # Kept until they are put back: a tick cut short (no answer in time) leaves them to the next.
        orphans = self._orphans[:]
        if lost or orphans:
            # We live, so the consumer deadline index will not send anyone for
            # these: put back the ones whose lock is gone (not those someone
            # else holds) ourselves. The loss was not the stream's fault (a
            # stall, an eviction, a partition): no retry is counted, and those
            # another consumer took over meanwhile are pardoned.
            try:
                await self.requeue.lost_while_alive(
                    [h.entry_id for h in (*lost, *orphans)],
                    "lock lost while held (heartbeat missed)",
                )
                del self._orphans[: len(orphans)]
            except RedisError as exc:
                s.log.warning(
                    "re-queue of %d lost assignments failed (%s); the next tick tries the ones lost "
                    "to the lease again, the scan the others",
                    len(lost) + len(orphans),
                    exc,
                )
        if cfg.hold_warning is not None:
            self._report_overdue(cfg.hold_warning)
        await self.requeue.malformed.retry_undead()
        return len(lost)

    async def mark_running(self, records: list[Held]) -> None:
        """Tell Redis that those of ``records`` the application took from the notification queue
        (:meth:`Held.start`) run now, before it works on them, so that a death from here on counts
        against them: their ids leave this consumer's queued set (SREM), in one round trip on a pool
        connection. When it fails the next tick sends them again."""
        ids = HeldTable.pending_marks(records)
        if not ids:
            return
        key = self.state.names.queued_key

        def build(b: CommandBatch) -> None:
            for i in range(0, len(ids), MARK_SLICE):
                b.command("SREM", key, *ids[i : i + MARK_SLICE])

        try:
            first_error(await self.state.link.pool.execute(build, retry_safe=True))
        except (RedisError, OSError) as exc:
            self.state.log.debug(
                "marking %d streams running failed (%s); the next heartbeat will", len(ids), exc
            )
            return
        HeldTable.settle_marks(records)

    def _warn(self, what: str) -> None:
        """Something the tick's last call could not do (extend-n.lua's string outputs)."""
        s = self.state
        if what.startswith("INSTANCE"):
            s.hooks.metric("duplicate_consumer_total", 1)
            s.log.error(
                "another live process runs with consumer id %s (instance %s, this one %s): their "
                "locks and pending entries mix; give each process its own id",
                s.names.id,
                what.partition(" ")[2],
                s.names.instance,
            )
        else:
            s.hooks.metric("wrong_type_keys_total", 1)
            s.log.error("heartbeat: %s", what.removeprefix("LBSKEY "))

    def _report_overdue(self, limit: float) -> None:
        """Warn once per stream held longer than ``limit`` seconds; the ``held_overdue`` gauge counts them.

        Looked at no more often than every ``limit / 10`` seconds: the walk
        and the set are as long as the overdue streams are many.
        """
        now = time.monotonic()
        if now < self._overdue_next:
            return
        self._overdue_next = now + limit / 10
        overdue = self.state.holdings.table.taken_before(now - limit)
        warned = self._overdue_warned
        if warned:
            warned.intersection_update(h.entry_id for h in overdue)
        for h in overdue:
            if h.entry_id not in warned:
                warned.add(h.entry_id)
                self.state.log.warning(
                    "%s (entry %s, token %d) has been held for over %.0fs without being "
                    "finished: call done_stream or hand_back, or use `async with notification:`",
                    h.stream,
                    h.entry_id,
                    h.token,
                    limit,
                )
        self.state.hooks.metric("held_overdue", len(overdue))

    def _disown(self, h: Held, reason: str) -> None:
        s = self.state
        s.holdings.tombstone(h)
        s.log.warning(
            "lost the lock of %s (entry %s, token %d): %s", h.stream, h.entry_id, h.token, reason
        )
        s.hooks.notify("lbs_stream_disowned", stream=h.stream, entry_id=h.entry_id, token=h.token)
        s.journal.record(
            "disowned", stream=h.stream, entry_id=h.entry_id, token=h.token, reason=reason
        )
        if h.task is not None and not h.task.done():
            h.task.cancel()
        s.mailbox.put_nowait(
            Notification(
                NotificationType.STREAM_DISOWNED,
                h.stream,
                h.entry_id,
                h.info,
                h.retry_count,
                h.token,
                reason,
            )
        )
