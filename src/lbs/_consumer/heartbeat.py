"""The heartbeat: this consumer's lease extended in one round trip per tick, whatever it holds.

Each tick (every ``Config.heartbeat_every``, a quarter of that after a
failed one) extends the consumer's lease ``{<service>-input}:lease:<id>`` and
moves its deadline in the index, without Lua where the server has ``SET ...
IFEQ`` (one ``MULTI``, :mod:`lbs._redis.beat`), else ``extend-n.lua``: every
entry pending to this consumer is held by that one key, so a tick costs Redis
the same for one held stream or a million. A lease found lost while its holder lives (a
stall, an eviction, a partition) disowns every held stream; the lease is
taken again and what is still pending to this consumer is put back with no
retry counted. The tick also warns of streams held past
``Config.hold_warning`` and retries dead letters that could not be written.

The heartbeat runs until the client's shutdown stops it, after the drain
and the hand-back: a stream whose handler still runs while ``close()``
drains stays held, however long the drain is beside the lease TTL.

**The local lease** says until when (on the client's monotonic clock) the
lease in Redis surely lives whatever the network does. A tick that Redis
answered renews it to the tick's send time plus the TTL (less a margin); a
stream taken since is covered from the send time of the write that took it
(:meth:`Heartbeat.cover`). A reply read too late to run its entries (a frozen
process: SIGSTOP, a long pause, a starved VM, whose blocking read Redis
answered meanwhile) is refused there, before any handler starts; one that
leaves less than a tick's interval gets a tick at once. When the local lease
runs out every held stream is disowned at that moment, its handler cancelled.

Beside a Go fleet (``Config.go_compatible``) the same call keeps a Go-style
lock beside each held stream (``max(lock_ttl, 4 s)``, so a dead lbs
consumer's streams outlive Go's 2-s claim idle) and refreshes the held
entries' idle time (Go's XAUTOCLAIM takes idle entries); a stream whose
Go-style lock holds another name was taken by a Go consumer: it is disowned
and counted (``go_taken_total``).
"""

from __future__ import annotations

import asyncio
import time

from redis.exceptions import RedisError, ResponseError

from _lbscore import CommandBatch, Held, HeldTable

from .. import _keys
from .._redis import beat, clock, pending
from .._redis.errors import NoGroupError, classify
from .._redis.wire import first_error, text
from .._waits import within
from ..config import GO_MIN_IDLE
from ..exceptions import RedisOperationError
from .activity import Activity
from .finisher import Finisher
from .requeue import Requeue
from .state import ClientState
from .topology import Topology

__all__ = ["Heartbeat"]

#: Entry ids per SREM that takes streams out of the queued set.
MARK_SLICE = 5_000
#: Pending entries per XPENDING page when the lease lapsed (what is put back before it is taken again).
OWN_PAGE = 1_000


class Heartbeat(Activity, kind="heartbeat"):
    """The heartbeat task of one client; the one caller of ``extend-n.lua``."""

    def __init__(
        self, state: ClientState, finisher: Finisher, requeue: Requeue, topology: Topology
    ) -> None:
        self.state, self.finisher, self.requeue, self.topology = state, finisher, requeue, topology
        #: Unused since the consumer lease, never counted up (it picked which entries refreshed their
        #: pending idle time); ``stats.heartbeats`` counts the ticks.
        self.beats = 0
        self._overdue_warned: set[str] = set()  # entry ids reported as held past hold_warning
        self._overdue_next = 0.0  # when the tick looks for them again (monotonic)
        #: The local lease: until when (monotonic) the lease is ours for sure, whatever the network
        #: does: the send time of the last tick Redis answered (or of the start) plus the lease TTL,
        #: less a margin. A lease Redis extended then expires no earlier (it counts from when it ran).
        self.lease_until = time.monotonic() + self._lease()
        #: Streams disowned when the lease ran out, put back (no retry counted) by the next tick that
        #: reaches Redis: their holder lives, so no deadline will send anyone for them soon.
        self._orphans: list[Held] = []
        #: The server's clock, from each tick's TIME: what a Lua-free tick dates the deadline by.
        self.clock = clock.ServerClock()
        #: When the tick looks again for entries pending to this consumer that it no longer tracks.
        self._strays_next = time.monotonic() + state.config.reconciliation_interval
        #: Fires at ``lease_until`` whatever the ticks are doing (a cut-off round trip may take long to give up).
        self._lease_timer: asyncio.TimerHandle | None = None

    async def stop(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        await super().stop()

    def _renew(self, until: float) -> None:
        """The lease is ours until ``until`` (monotonic): (re)arm the lease timer."""
        self.lease_until = until
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        loop = asyncio.get_running_loop()
        # The loop's clock is time.monotonic() (asyncio's default); the timer fires at the lease's end.
        self._lease_timer = loop.call_at(
            loop.time() + max(0.0, until - time.monotonic()), self._lease_expired
        )

    def _lease(self) -> float:
        """How long a confirmed lease is surely ours: the TTL less a margin for clock drift (5 %, at most 1 s)."""
        ttl = self.state.config.lock_ttl
        return ttl - min(0.05 * ttl, 1.0)

    def min_left(self) -> float:
        """The least lease a stream must have left to be started: a quarter of a tick's interval, the
        wait before a failed tick's retry (one round trip for a tick sent at once)."""
        return self.state.config.heartbeat_every / 4

    def cover(self, sent: float) -> bool:
        """Whether streams taken by a write sent at ``sent`` (monotonic) may start: they are held by the
        lease, which lives at least until the local lease ends. False when less than :meth:`min_left` of
        it is left: the reply was read too late (the process was frozen while Redis answered), the lease
        may have lapsed and another consumer may already run them, and none may start here."""
        return self.lease_until - time.monotonic() >= self.min_left()

    async def _main(self) -> None:
        s = self.state
        every = s.config.heartbeat_every
        wait = every
        self._renew(time.monotonic() + self._lease())
        # Until stop(), which the shutdown calls once nothing is held any more: a drain keeps its lease.
        while True:
            await asyncio.sleep(wait)
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
                self._renew(sent + self._lease())
                wait = every
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
                # before the lease (extended at most a tick ago) can expire.
                wait = every / 4
                s.log.warning("heartbeat failed: %s; next try in %.2fs", exc, wait)

    def _lease_expired(self) -> None:
        """No tick confirmed the lease for a lease TTL (a partition, a stalled server): it may have
        expired and another consumer may take the streams at any moment. Disown every held stream
        here and now (handlers cancelled, STREAM_DISOWNED), before anyone else can start them."""
        s = self.state
        self._lease_timer = None
        # While close() drains too: a handler must not outlive its lease.
        held = [h for h in s.holdings.table.values() if s.holdings.drop(h)]
        if not held:
            return
        s.hooks.metric("lease_expired_total", len(held))
        s.log.error(
            "no heartbeat reached Redis for %.1fs (the lease TTL, less a margin): disowning the %d streams "
            "held, whose lease may be expiring",
            self._lease(),
            len(held),
        )
        for h in held:
            self._disown(
                h,
                "lease expired: no heartbeat confirmed the lease for a lease TTL (cut off from Redis?)",
            )
        self._orphans += held

    async def tick(self) -> int:
        """Extend this consumer's lease now, in one round trip whatever it holds; return how many held
        streams were lost (``Client.heartbeat``): all of them when the lease was."""
        s = self.state
        n, cfg = s.names, s.config
        table = s.holdings.table
        snapshot = table.values()
        held = len(snapshot)
        finishing = self.finisher.finishing()
        if finishing:  # still ours until Redis answers their done: keep them alive
            snapshot += finishing
        started = time.perf_counter()
        ttl = cfg.lock_ttl_ms
        # Beside a Go fleet the call also keeps our Go-style locks (they outlive Go's 2-s claim idle)
        # and refreshes the held entries' idle time (a Go consumer's XAUTOCLAIM takes idle entries).
        go = (
            (
                max(ttl, int(GO_MIN_IDLE * 1000)),
                [h.entry_id for h in snapshot],
                [_keys.go_lock_key(h.stream, h.entry_id) for h in snapshot],
            )
            if cfg.go_compatible
            else None
        )

        # The token records of batches finished since the last tick (`lbs status` reads them).
        finished = s.holdings.finished_batches[:]
        lease = s.lease.value
        # Without Lua where the server can (SET ... IFEQ) and the deadline can be told from its clock.
        sent = time.monotonic()
        now_ms = self.clock.now_ms(sent) if s.server.set_ifeq and go is None else None
        plain = now_ms is not None

        def build(b: CommandBatch) -> None:
            beat.extend(
                b,
                n.stream_key,
                n.consumers_key,
                n.lease_key,
                ttl_ms=ttl,
                group=n.group,
                consumer=n.id,
                lease=lease,
                deadline_ms=None if now_ms is None else now_ms + ttl,
                go=go,
            )
            if finished:
                b.command("HDEL", n.tokens_key, *finished)

        try:
            # Extending the lease checks its value first: sending a tick twice is harmless.
            replies = await s.link.beat.execute(build, retry_safe=True)
            positions, now, rest = beat.extend_reply(replies, plain, lease, n.consumers_key)
        except RedisError as exc:
            raise RedisOperationError("heartbeat", exc) from exc
        self.clock.note(now, sent, time.monotonic())
        # The records' HDEL is bookkeeping for `lbs status`: its failure (an ACL without +hdel, a key of
        # another type) is reported and never fails the tick that keeps the lease.
        failed = rest[0] if finished and isinstance(rest[0], Exception) else None
        if failed is not None and not s.denied(
            failed, f"deleting finished records from {n.tokens_key}"
        ):
            s.log.warning("deleting finished batches' records failed: %s", failed)
        del s.holdings.finished_batches[: len(finished)]
        s.stats.heartbeats += 1
        s.stats.heartbeat_at = time.monotonic()
        await self.mark_running(snapshot)  # marks a take could not send (none, nearly always)
        lost: list[Held] = []
        lost_back = False  # the lease was taken again, and what it held put back first
        holder: str | None = None  # what the lease key holds when it is not ours
        for p in positions:
            if not isinstance(p, int):
                note = text(p)
                if note.startswith("LEASE"):
                    holder = note[6:]
                else:
                    self._warn(note)
            elif s.holdings.drop(h := snapshot[-p - 1]):  # a Go consumer took it
                s.hooks.metric("go_taken_total", 1)
                self._disown(h, "a Go consumer took it (its Go-style lock holds another name)")
        if holder is not None:
            # Everything held was read under the lease that lapsed: recovery may have handed it on.
            settling = s.holdings.settling  # let go by a keyed commit in flight, not lost
            lost = [h for h in snapshot if h.entry_id not in settling and s.holdings.drop(h)]
            for h in lost:
                self._disown(h, "lease lost while held (heartbeat missed)")
            # Taken again: what it held was put back first. Not taken (another live process runs
            # with this consumer id, or the key is garbage): that one holds what is pending to the id,
            # and nothing is put back or pardoned here.
            await self._retake(holder, [h.entry_id for h in lost])
            lost_back = True
        if held:  # a tick holding nothing only kept the lease alive
            s.hooks.notify(
                "lbs_locks_extended",
                extended=held - len(lost),
                lost=len(lost),
                seconds=time.perf_counter() - started,
            )
        # Kept until they are put back: a tick cut short (no answer in time) leaves them to the next.
        orphans = self._orphans[:]
        lost_ids: list[Held] = [] if lost_back else lost
        if lost_ids or orphans:
            # We live, so the consumer deadline index will not send anyone for
            # these: put back the ones still pending to us ourselves. The loss
            # was not the stream's fault (a stall, an eviction, a partition):
            # no retry is counted, and those another consumer took over
            # meanwhile are pardoned.
            try:
                await self.requeue.lost_while_alive(
                    [h.entry_id for h in (*lost_ids, *orphans)],
                    "lease lost while held (heartbeat missed)",
                )
                del self._orphans[: len(orphans)]
            except RedisError as exc:
                s.log.warning(
                    "re-queue of %d lost assignments failed (%s); the next tick tries the ones lost "
                    "to the lease again, the scan the others",
                    len(lost_ids) + len(orphans),
                    exc,
                )
        if cfg.hold_warning is not None:
            self._report_overdue(cfg.hold_warning)
        await self.requeue.malformed.retry_undead()
        if time.monotonic() >= self._strays_next:
            await self._put_back_strays()
        return len(lost)

    async def _put_back_strays(self) -> None:
        """Entries pending to this consumer that it no longer tracks (a hand-back or a done Redis
        refused, a keyed hold dropped after a failure) are held by nobody while its lease lives: no
        recovery takes them. Once per ``reconciliation_interval``, those idle at least a lease TTL (a
        read in flight is younger) and neither held, nor being finished or handed back, go back with
        no retry counted. A failure waits for the next round."""
        s = self.state
        cfg = s.config
        self._strays_next = time.monotonic() + cfg.reconciliation_interval
        try:
            idle = await self.own_pending(idle_ms=cfg.lock_ttl_ms)
            tracked = self.tracked()
            stale = [i for i in idle if i not in tracked]
            if stale:
                reason = "pending to this consumer, which no longer held it"
                back = await self.requeue.recover(
                    stale, "heartbeat", reason, count_retry=False, mode="owned"
                )
                s.log.warning("put back %d of %d streams %s", back, len(stale), reason)
        except RedisError as exc:
            s.log.warning(
                "looking for streams pending to this consumer failed (%s); next round", exc
            )

    def tracked(self) -> set[str]:
        """Entry ids this client tracks: held, being finished, being handed back."""
        s = self.state
        return (
            {h.entry_id for h in s.holdings.table.values()}
            | {h.entry_id for h in self.finisher.finishing()}
            | self.requeue.handing_back
        )

    async def _retake(self, holder: str, disowned: list[str]) -> bool:
        """The lease was gone (``holder`` "") or held by another process: take it again, with a new value;
        True when it was taken (and what was pending to this consumer put back first).

        Every stream held was disowned by the caller (``disowned``): they were read under the lease that
        lapsed, and recovery may already have handed them to another consumer (then it counted a death:
        pardoned, as the holder lived). What is still pending to this
        consumer (those streams, replies refused as late, dones that came back LOCK_LOST) is put back
        while the lease is gone (mode ``absent``, no retry counted; a read's take is refused meanwhile,
        and what it read is put back by the reader once the lease is back), before the lease is taken
        again; otherwise it would stay pending under the new lease, held by nobody. Another live process with our consumer id keeps
        the lease; this one is told loudly and tries again next tick.
        """
        s = self.state
        n = s.names
        if holder and not holder.startswith("WRONGTYPE"):
            s.hooks.metric("duplicate_consumer_total", 1)
            s.log.error(
                "another live process runs with consumer id %s (instance %s, this one %s): it holds "
                "the lease %s, so this process holds nothing; give each process its own id",
                n.id,
                holder,
                s.lease.value,
                n.lease_key,
            )
            if s.lease.held == s.lease.takes:
                # What it held (disowned) and what waits to be finished are not its own: a done of them
                # is refused here (the Lua-free done checks no lease), and reads wait for a take.
                self.finisher.lease_lost()
                s.holdings.renew(s.lease.next())
            return False
        if holder:
            s.hooks.metric("wrong_type_keys_total", 1)
            s.log.error("heartbeat: %s holds a value of the wrong type, not a lease", n.lease_key)
            return False
        self.finisher.lease_lost()
        pending = await self.own_pending()
        if pending:
            await self.requeue.lost_while_alive(
                pending, "lease lost while held (heartbeat missed)", mode="absent"
            )
        # What it held that is no longer pending to it was taken over by another consumer's recovery,
        # which counted a death this living holder did not die: pardoned.
        still = set(pending)
        taken = [i for i in (*disowned, *(h.entry_id for h in self._orphans)) if i not in still]
        if taken:
            await self.requeue.pardon(taken)
        self._orphans.clear()
        # A new value: a write still in flight under the lapsed one (a read, a done) is refused.
        value = s.lease.next()
        s.holdings.renew(value)
        s.log.warning(
            "this consumer's lease %s lapsed (a stall, a partition): %d streams put back; taking it "
            "again (%s)",
            n.lease_key,
            len(pending),
            value,
        )
        if await s.link.redis.set(n.lease_key, value, nx=True, px=s.config.lock_ttl_ms):
            s.lease.took()
        return True

    async def own_pending(self, idle_ms: int | None = None) -> list[str]:
        """The ids of every entry pending to this consumer (XPENDING by consumer, a page at a time), or of
        those idle at least ``idle_ms``."""
        s = self.state
        n = s.names
        ids: list[str] = []
        try:
            async for page in pending.pages(
                s.link.redis, n.stream_key, n.group, OWN_PAGE, idle_ms=idle_ms, consumer=n.id
            ):
                ids += [text(p["message_id"]) for p in page]
        except ResponseError as exc:
            if not isinstance(classify(exc), NoGroupError):
                raise  # no group (a restart without persistence): nothing is pending
        return ids

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
        """A key the tick could not use (extend-n.lua's "LBSKEY ..." notes)."""
        s = self.state
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
        s.log.warning("lost %s (entry %s, token %d): %s", h.stream, h.entry_id, h.token, reason)
        s.hooks.notify("lbs_stream_disowned", stream=h.stream, entry_id=h.entry_id, token=h.token)
        s.journal.record(
            "disowned", stream=h.stream, entry_id=h.entry_id, token=h.token, reason=reason
        )
        s.let_go(h, reason)
