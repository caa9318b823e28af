"""The reader: read assignments under this consumer's lease with plain commands, and hand them out.

What the reader reads is pending to this consumer in the group, and held exactly while its lease
(``{<service>-input}:lease:<id>``) lives. A read is an ``XREADGROUP`` (blocking in Redis when the
last one drained the group: one XADD wakes one waiting reader, which reads in the same turn of the
server's loop) and the take (:class:`~lbs._consumer.take.Taker`: one ``MULTI`` that checks the lease,
takes the batch's fencing token and its names). A take under a lease not this process's holds
nothing (``LeaseLostError``): the reader reads again once the heartbeat took the lease back. Each
batch is parsed in the compiled core (entries come back as ``Entry`` objects); good entries become
held streams and go to the runner (under ``run()``) or the mailbox as STREAM_ADDED; malformed ones are
dead-lettered.

After a full batch the next read is sent before the batch is handed out (when capacity allows
both), so Redis reads the next batch while this one is dispatched. Fair dispatch
(``Config.fair_dispatch``): a blocking read takes two (a trickle's read looks at nobody), and a read
after a full one first asks for this consumer's share (:meth:`Taker.share`); a share taken waits for
one of its own slots to free, or :data:`SHARE_RECHECK`. ``CLIENT UNBLOCK`` wakes a blocking read at
shutdown. While the service is paused (:mod:`lbs._consumer.control`) it reads nothing. A reply whose connection failed may have delivered entries: the next read re-reads this
consumer's pending entries (``read-3.lua``) and takes them.

Each batch goes to :class:`~lbs._consumer.intake.Intake`, which refuses a batch read too late to
start its entries (a frozen process: the local lease ran out). The wait is capped at half the local
lease so that a reply read on time always passes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.exceptions import RedisError, ResponseError

from _lbscore import CommandBatch, Entry

from .._redis import reads, scripts
from .._redis.connection import cancel_and_wait
from .._redis.errors import LeaseLostError, NoGroupError, classify
from .._redis.wire import REPLY_TIMEOUT
from .._waits import wait_set
from ..notifications import Notification, NotificationType
from .activity import Activity
from .backoff import Backoff
from .control import Controls
from .finisher import Finisher
from .intake import Dispatch, Intake
from .ratelimit import RateLimiter
from .requeue import Requeue
from .runner import start_task
from .slots import RAMP_FROM, WAITING_READ
from .state import ClientState
from .take import Taker
from .topology import Topology

__all__ = ["Reader"]

#: How long a reader whose fair share is taken waits (for a slot of its own to free) before it looks
#: at its peers again (seconds).
SHARE_RECHECK = 0.05
#: What a blocking read asks for under fair dispatch: one more than a trickle brings, so that a
#: reply of two says more waits (and the next read looks at the peers first).
FAIR_WAKE = 2

#: What a read says to do next: more may wait, read again at once.
READ_AGAIN = b""
#: Nothing more to deliver: the next read blocks in Redis until an XADD.
DRAINED = b"drained"
#: Fair dispatch left what waits to idle peers: look again once a slot of ours frees (or soon).
SHARE_TAKEN = b"share"

#: What a read's task gives: its entries, one token each, and what to do next.
_Batch = tuple[list[Entry], list[Any], bytes]


class Reader(Activity, kind="reader"):
    """The reading task of one client; the one caller of ``read-3.lua`` (its re-read after a lost reply)."""

    def __init__(
        self,
        state: ClientState,
        finisher: Finisher,
        requeue: Requeue,
        topology: Topology,
        cover: Callable[[float], bool],
        controls: Controls,
    ) -> None:
        self.state, self.finisher, self.requeue, self.topology = state, finisher, requeue, topology
        #: The service's pause (the reader waits while it lasts).
        self.controls = controls
        #: Turns each reply's entries into held streams (checked against the heartbeat's lease).
        self.intake = Intake(state, requeue, cover)
        #: Under run(): the runner's dispatch, which starts a handler per taken stream.
        self.dispatch: Dispatch | None = None
        #: In a blocking read now (CLIENT UNBLOCK wakes it).
        self.blocked = False
        #: A read's reply was lost: re-read (and take) our own pending entries before reading more.
        self.reply_lost = False
        #: The send time (monotonic) of the earliest write whose reply was lost (inf: not known, the
        #: re-read's own send time stands).
        self._lost_sent = math.inf
        #: Makes each batch ours: the lease, the token, the names (plain commands).
        self.taker = Taker(state, requeue)
        #: The service's rate limit (``Config.rate_limit``): what each read of new entries may take.
        self.limiter = RateLimiter(state) if state.config.rate_limit is not None else None
        self._sent_at: dict[asyncio.Task[_Batch], float] = {}  # each read in flight: when sent
        self._reads: dict[asyncio.Task[_Batch], int] = {}  # reads of new entries in flight: asked
        self._tracked: set[str] = set()  # what was ours when the last re-read was sent
        self._ramp = RAMP_FROM  # shared slots: what a read not waiting in Redis asks for (_room)

    async def _main(self) -> None:
        s = self.state
        cfg = s.config
        failures = 0
        backoff = Backoff(cfg.read_retry_initial, cfg.read_retry_max)
        # Within the wire's reply watchdog, with room for the read behind the wait, and within half the
        # local lease: a reply read on time always finds the local lease with room to start its entries.
        lease = cfg.lock_ttl - min(0.05 * cfg.lock_ttl, 1.0)
        block_ms = max(1, int(min(cfg.read_block, REPLY_TIMEOUT / 2, lease / 2) * 1000))
        then = READ_AGAIN  # what the last read said to do next
        # A read sent ahead, before the previous batch was dispatched: (reply task, count asked).
        ahead: tuple[asyncio.Task[_Batch], int] | None = None

        # Slots freed (Holdings.frees) when the last read of new entries was sent: fair dispatch
        # looked at the shares then, so a slot freed since is a reason to look again at once.
        looked = s.holdings.frees

        def read_ahead(got: int, asked: int) -> None:
            nonlocal ahead, looked
            if got >= asked:
                self._ramp = min(2 * self._ramp, s.read_count)
            count = self._room(READ_AGAIN, got)
            if got >= asked and count > 0 and not s.stopping.is_set():
                looked = s.holdings.frees
                ahead = (self._send(count, ">"), count)

        try:
            while not s.stopping.is_set():
                try:
                    if ahead is not None:
                        sent, asked = ahead
                        ahead = None
                    else:
                        room = self._room(then)
                        if room <= 0:
                            # Full: read again once a slot is freed (or after read_block). Cleared
                            # before looking again, so a slot freed in between is not missed.
                            then = READ_AGAIN
                            freed = s.holdings.freed
                            freed.clear()
                            if self._room(then) <= 0:
                                await self.taker.flush_record()
                                await wait_set(freed, cfg.read_block)
                            continue
                        if self.taker.paused or self.controls.paused:
                            # Paused: what a take found paused goes back (no retry counted),
                            # then nothing is read until the resume.
                            if self.taker.paused:
                                self.taker.paused = False
                                self.controls.found_paused()
                            if self.taker.stranded and s.lease.held == s.lease.takes:
                                await self.taker.put_back_stranded("the service is paused")
                            await self.controls.wait_resumed()
                            then = READ_AGAIN
                            continue
                        if self.taker.stranded and s.lease.held == s.lease.takes:
                            # A refused take left these pending to us, held by nobody: back, now
                            # that the lease is ours.
                            await self.taker.put_back_stranded()
                        if self.reply_lost:
                            # The last read's reply never arrived: the entries it
                            # delivered are in our pending list, held by our lease.
                            # Take them (with their recorded token) before reading more.
                            await self._take(self._send(s.capacity + s.read_count, "0"), "0")
                            self.reply_lost, self._lost_sent = False, math.inf
                        if then == SHARE_TAKEN:
                            # Fair dispatch left what waits to idle peers: look again once a
                            # slot of ours frees, or soon (a peer that looked idle may not read).
                            freed = s.holdings.freed
                            freed.clear()
                            await self.taker.flush_record()
                            if s.holdings.frees == looked:  # none freed since the look
                                await wait_set(freed, SHARE_RECHECK)
                        asked = room
                        # Drained: wait in Redis (a blocking XREADGROUP) for the next XADD.
                        wait = block_ms if then == DRAINED else 0
                        looked = s.holdings.frees
                        sent = self._send(asked, ">", wait)
                    then = READ_AGAIN  # what a take that fails leaves: read again
                    refused_under = s.lease.takes  # the take a refused read was sent under, at most
                    then = await self._take(sent, ">", partial(read_ahead, asked=asked))
                    if then == DRAINED:
                        self._ramp = RAMP_FROM
                except asyncio.CancelledError:
                    raise
                except ResponseError as exc:
                    if isinstance(classify(exc), LeaseLostError):
                        # The lease lapsed (a stall, a partition): nothing was read. The heartbeat's
                        # next tick takes it again; read again soon, not counted as a failed read.
                        s.log.debug("read refused: %s; reading again once the lease is back", exc)
                        # Held by another process under our id (a duplicate): until its lease lapses.
                        other = str(exc).strip() not in ("LEASE", "")
                        await s.lease.taken_after(
                            refused_under, cfg.lock_ttl if other else cfg.heartbeat_every / 4
                        )
                        continue
                    if isinstance(classify(exc), NoGroupError):
                        s.log.warning(
                            "group %s or stream %s vanished; recreating it",
                            s.names.group,
                            s.names.stream_key,
                        )
                        try:
                            await self.topology.ensure_group()
                            continue
                        except RedisError as again:
                            exc = again  # type: ignore[assignment]
                    if s.lease.held == s.lease.takes:
                        await (
                            self.taker.put_back_stranded()
                        )  # a refused take: nothing of it is held
                    failures += 1
                    if not await self._failed(exc, failures, backoff):
                        return
                    continue
                except (RedisError, OSError) as exc:
                    failures += 1
                    if not await self._failed(exc, failures, backoff):
                        return
                    continue
                failures = 0
                backoff.reset()
            if ahead is not None:
                # Stopped with a read in flight: its entries are pending to us, held
                # by our lease. Take them (so close() hands them back) rather than
                # leave them to recovery once the lease expires.
                sent, ahead = ahead[0], None
                await self._take(sent, ">")
        finally:
            if ahead is not None:
                # Cancelled or given up with a read in flight: its entries are
                # pending to us; recovery brings them back once our lease expires.
                self.lose_reply(self._sent_at.pop(ahead[0], math.inf))
                self._settled(ahead[0])
                ahead[0].cancel()

    def _room(self, then: bytes, taking: int = 0) -> int:
        """What the next read of new entries asks for (``taking`` being taken already); 0: wait for a
        slot. Shared slots (:mod:`lbs._consumer.slots`): a read not waiting in Redis asks for the
        ramp (from :data:`RAMP_FROM`, doubled by each read that gets all it asked for, up to
        ``read_count``), and none is sent for less than half of it while another shard's read is in
        flight (its reply frees what it does not take), so shards with a backlog read in turns, in
        batches, rather than all at once in slivers, and a trickle reserves few slots."""
        s = self.state
        free = s.free_slots(taking)
        if s.slots is None or then == DRAINED:
            return max(0, min(s.read_count, free))
        ask = min(s.read_count, self._ramp)
        if free >= max(1, ask // 2) or (free > 0 and not s.slots.read_elsewhere(s)):
            return min(ask, free)
        return 0

    def _send(self, count: int, start: str, wait_ms: int = 0) -> asyncio.Task[_Batch]:
        """Start reading up to ``count`` entries: new ones (">", with plain commands: an ``XREADGROUP``
        that waits up to ``wait_ms`` in Redis for one, then the take), or our own pending ones again
        ("0", after a lost reply: ``read-3.lua``). The first write goes out before this returns (the
        task's first step runs at once); the task's result is the batch."""
        # Before sending: sending can yield, and stop() must see that a wait is under way.
        self.blocked = wait_ms > 0
        if wait_ms and self.state.slots is not None:
            # Shared slots: a waiting read asks for few, and reserves none (lbs._consumer.slots).
            count = min(count, WAITING_READ)
        sent = time.monotonic()
        coro = self._read_new(count, wait_ms) if start == ">" else self._reread(count)
        task = start_task(asyncio.get_running_loop(), coro, "lbs-read")
        self._sent_at[task] = sent
        if start == ">":
            if not wait_ms:  # a waiting read reserves no shared slot (see _read_new)
                self._reads[task] = count
                self.state.reading += count
        else:
            # What is ours now (held, being finished or handed back) is not the lost reply's: a
            # stream finished while the re-read is under way is gone from all three by the time
            # its reply is read, though the re-read may still list it. Stranded entries are re-read.
            self._tracked = self._ours()
            self.taker.stranded.clear()
        return task

    async def _read_new(self, count: int, wait_ms: int) -> _Batch:
        """One read of new entries and its take (see :mod:`lbs._consumer.take`)."""
        s = self.state
        n = s.names
        cfg = s.config
        then_if_full = READ_AGAIN
        if wait_ms:
            if cfg.fair_dispatch:
                count = min(count, FAIR_WAKE)  # a trickle: no look at the peers
        elif cfg.fair_dispatch:
            share = await self.taker.share(count)
            if share <= 0:
                return [], [], SHARE_TAKEN
            if share < count:
                count, then_if_full = share, SHARE_TAKEN
        if self.limiter is not None:  # the fleet's rate limit: ask its window first (it may wait)
            count, wait_ms = await self.limiter.grant(count, wait_ms)
            if count <= 0:
                return [], [], READ_AGAIN
        recorded = False

        def build(b: CommandBatch) -> None:
            nonlocal recorded
            recorded = self.taker.record(b)
            reads.read(b, n.stream_key, n.group, n.id, count, wait_ms)

        try:
            replies = await s.link.read.execute(build, s.parser)
        finally:
            self.blocked = False
        if recorded:
            self.taker.recorded(replies[0])
        entries = replies[-1]
        if isinstance(entries, Exception):
            raise entries
        if wait_ms and s.slots is not None:
            # A waiting read reserves no shared slot (lbs._consumer.slots): what finds none free now
            # goes back to the LBS, no retry counted (or, the lease lapsed, once it is back). What it
            # keeps counts as being read until it is held (_settled), as a reserved read's does, so
            # another member's reply meanwhile finds those slots taken.
            keep = max(0, min(len(entries), s.free_slots()))
            self._reads[asyncio.current_task()] = keep  # type: ignore[index]
            s.reading += keep
            if keep < len(entries):
                self.taker.stranded += [e.id for e in entries[keep:]]
                entries = entries[:keep]
                if s.lease.held == s.lease.takes:
                    await self.taker.put_back_stranded("no slot free in this process")
        if self.limiter is not None:
            self.limiter.got(len(entries))
        then = DRAINED if len(entries) < count else then_if_full
        # A backlog: a read of several that got all it asked for, neither waiting (a trickle) nor
        # cut to a fair share (a read of one tells nothing).
        s.backlog = not wait_ms and then_if_full == READ_AGAIN and 2 <= count <= len(entries)
        if not entries:
            return [], [], then
        tokens = await self.taker.take(entries, self.dispatch is None)
        if self.taker.paused:
            return [], [], READ_AGAIN  # stranded: back to the LBS while the reader waits
        return entries, tokens, then

    async def _reread(self, count: int) -> _Batch:
        """Our own pending entries again (a read's reply was lost): ``read-3.lua`` lists them with the
        tokens their reads recorded (fresh ones where none did), then their names are taken one by
        one (the lost take may not have taken them)."""
        s = self.state
        n = s.names
        args = (n.stream_key, n.fence_key, n.lease_key, n.group, n.id, count, s.lease.value)
        replies = await s.link.read.execute(
            lambda b: scripts.read(b, *args, tokens=n.tokens_key), s.parser, retry_safe=True
        )
        reply = replies[-1]
        if isinstance(reply, Exception):
            raise reply
        entries, tokens = reply
        tokens = list(tokens)
        if entries:
            await self.taker.names_of(entries, tokens)
        return entries, tokens, READ_AGAIN

    def _skipped(self, start: str) -> set[str] | tuple[()]:
        """What a take must not take again: on a re-read ("0"), what we track now or did when it was sent."""
        return self._ours() | self._tracked if start != ">" else ()

    def _ours(self) -> set[str]:
        """Entry ids this client tracks: held, being finished, being handed back."""
        return (
            {h.entry_id for h in self.state.holdings.table.values()}
            | {h.entry_id for h in self.finisher.finishing()}
            | self.requeue.handing_back
        )

    async def _take(
        self,
        sent: asyncio.Task[_Batch],
        start: str,
        before_dispatch: Callable[[int], None] | None = None,
    ) -> bytes:
        """Take the batch of a :meth:`_send`: its entries become held streams.

        Returns what to do next (:data:`READ_AGAIN`, :data:`DRAINED`,
        :data:`SHARE_TAKEN`). ``before_dispatch(n)`` runs once ``n`` entries are
        in, before they are handed out (to send the next read).
        """
        sent_at = self._sent_at.get(sent, math.inf)
        if start != ">":
            sent_at = min(sent_at, self._lost_sent)  # a re-read takes what the lost reply held
        try:
            try:
                entries, tokens, then = await sent
            except ResponseError:
                raise  # Redis answered: nothing was lost (a take's refusal strands its entries)
            except BaseException:
                # I/O or cancellation: a reply may be lost whose entries are now pending to us.
                self.lose_reply(sent_at)
                raise
            finally:
                self.blocked = False
            if entries:
                if before_dispatch is not None:
                    before_dispatch(len(entries))
                await self.intake.hand_out(
                    entries, tokens, start, sent_at, self.dispatch, self._skipped(start)
                )
            return then
        finally:
            self._settled(sent)
            self._sent_at.pop(sent, None)

    def _settled(self, sent: asyncio.Task[_Batch]) -> None:
        """A read of new entries is taken (or abandoned): what it asked for no longer counts as being
        read; clients sharing the slots look again (it may have taken less)."""
        asked = self._reads.pop(sent, 0)
        if asked:
            s = self.state
            s.reading -= asked
            if s.slots is not None:
                s.slots.wake(s)

    def lose_reply(self, sent: float = math.inf) -> None:
        """A reply to a write sent at ``sent`` (monotonic; inf: unknown) was lost: the next read re-reads
        and takes what it had taken, as far as the lease it was read under lasts."""
        self.reply_lost = True
        self._lost_sent = min(self._lost_sent, sent)

    async def _failed(self, exc: BaseException, failures: int, backoff: Backoff) -> bool:
        """Back off after a failed read; False when the reader gives up."""
        s = self.state
        cfg = s.config
        s.hooks.metric("read_failures_total", 1)
        await self.topology.after_failure(exc)
        if cfg.read_max_retries >= 0 and failures > cfg.read_max_retries:
            s.log.error("reader giving up after %d failed reads: %s", failures, exc)
            s.hooks.notify("lbs_reader_terminated", error=exc)
            s.mailbox.put_nowait(Notification(NotificationType.STREAM_TERMINATED, reason=str(exc)))
            return False
        wait = backoff.next()
        s.log.warning(
            "read of %s failed (%s: %s); retry %d in %.2fs",
            s.names.stream_key,
            type(exc).__name__,
            exc,
            failures,
            wait,
        )
        await backoff.sleep(s.stopping, wait)
        return True

    async def stop(self) -> None:
        """End the reader without losing a read batch (``state.stopping`` must be set).

        A blocking read is woken with CLIENT UNBLOCK (it returns as if it
        timed out, with nothing), and a reader busy taking a
        batch finishes it, so every entry it read is either held (and handed
        back) or untouched. Cancelling is the last resort, after one
        more read_block.
        """
        task = self.task
        if task is None:
            return
        s = self.state
        loop = asyncio.get_running_loop()
        give_up = loop.time() + s.config.read_block + 1.0
        unblock = True
        while not task.done():
            client_id = s.link.read.client_id
            if self.blocked and client_id is not None and unblock:
                # Sent again until the reader's wait returns: an UNBLOCK that
                # overtakes the wait it is meant for finds nothing to wake.
                try:
                    await s.link.redis.client_unblock(client_id)
                except RedisError as exc:
                    unblock = False
                    s.log.debug(
                        "CLIENT UNBLOCK refused (%s); waiting for the read to time out", exc
                    )
            if loop.time() > give_up:
                await cancel_and_wait([task])
                break
            await asyncio.wait([task], timeout=0.005)
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the reader logs its own failures
