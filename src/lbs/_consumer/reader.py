"""The reader: read assignments under this consumer's lease in one ``read-3.lua`` call, and hand them out.

What the reader reads is pending to this consumer in the group, and held exactly while its lease
(``{<service>-input}:lease:<id>``) lives: ``read-3.lua`` reads only under the lease it holds (a
lapsed lease refuses the read, ``LeaseLostError``, and the reader tries again once the heartbeat
took it back), with one fencing token per batch. Each batch is parsed in the compiled core (entries
come back as ``Entry`` objects); good entries become held streams and go to the runner (under
``run()``) or the mailbox as STREAM_ADDED; malformed ones are dead-lettered.

After a full batch the next read is sent before the batch is handed out
(when capacity allows both), so Redis reads the next batch while this one is
dispatched. A read that drained the group is followed by a wait and a read in
one write: a blocking ``XREADGROUP`` of the wake group (``<service>-wake``,
NOACK, one entry) and the ``read-3.lua`` call behind it, which Redis runs the
moment the wait returns. So an XADD wakes one consumer, which reads in the same
turn of the server's loop: one round trip per wake-up, as a plain
``XREADGROUP BLOCK`` loop has. A read that fair dispatch left short (its share
taken) waits the same way: the script nudged the idle peers it left the rest
to (an entry each in ``{<service>-input}:nudge``, which every wait reads
beside the LBS). ``CLIENT UNBLOCK`` wakes the wait at shutdown
(the read behind it still runs, and what it takes is handed back).

Each reply goes to :class:`~lbs._consumer.intake.Intake`, which refuses a
reply read too late to start its entries (a frozen process: the local lease
ran out). The wait is capped at half the local lease so that a reply read on
time always passes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.exceptions import NoScriptError, RedisError, ResponseError

from _lbscore import CommandBatch, Entry

from .._redis import scripts
from .._redis.connection import cancel_and_wait
from .._redis.errors import LeaseLostError, NoGroupError, classify
from .._redis.wire import REPLY_TIMEOUT
from .._waits import wait_set
from ..notifications import Notification, NotificationType
from .activity import Activity
from .backoff import Backoff
from .finisher import Finisher
from .intake import Dispatch, Intake
from .requeue import Requeue
from .runner import start_task
from .state import ClientState
from .topology import Topology

__all__ = ["Reader"]

#: How long a reader that nudges woke IDLE_NUDGES times in a row to find its share still taken (and
#: nothing to take) pauses before it waits again.
SHARE_PAUSE, IDLE_NUDGES = 0.01, 3


def _nudge_in(woke: Any, nudge: str) -> bool:
    """Whether a wait's reply (``XREADGROUP``'s, read generically) is an entry of the nudge stream."""
    key = nudge.encode()
    streams = woke.keys() if isinstance(woke, dict) else woke if isinstance(woke, list) else ()
    return any((s[0] if isinstance(s, (list, tuple)) and s else s) == key for s in streams)


class Reader(Activity, kind="reader"):
    """The reading task of one client; the one caller of ``read-3.lua``."""

    def __init__(
        self,
        state: ClientState,
        finisher: Finisher,
        requeue: Requeue,
        topology: Topology,
        cover: Callable[[float], bool],
    ) -> None:
        self.state, self.finisher, self.requeue, self.topology = state, finisher, requeue, topology
        #: Turns each reply's entries into held streams (checked against the heartbeat's lease).
        self.intake = Intake(state, requeue, cover)
        #: Under run(): the runner's dispatch, which starts a handler per taken stream.
        self.dispatch: Dispatch | None = None
        #: In a wait of the wake group now (CLIENT UNBLOCK wakes it).
        self.blocked = False
        #: A read's reply was lost: re-read (and adopt) our own pending entries before reading more.
        self.reply_lost = False
        #: The send time (monotonic) of the earliest write whose reply was lost (inf: not known, the
        #: re-read's own send time stands).
        self._lost_sent = math.inf
        self._sent_at: dict[asyncio.Task[list[Any]], float] = {}  # each read in flight: when sent
        self._reads: dict[
            asyncio.Task[list[Any]], int
        ] = {}  # reads of new entries in flight: how many each asked
        self._tracked: set[str] = set()  # what was ours when the last re-read was sent
        self._idle_nudges = 0  # reads in a row a nudge woke that took nothing, their share taken

    async def _main(self) -> None:
        s = self.state
        cfg = s.config
        failures = 0
        backoff = Backoff(cfg.read_retry_initial, cfg.read_retry_max)
        # Within the wire's reply watchdog, with room for the read behind the wait, and within half the
        # local lease: a reply read on time always finds the local lease with room to start its entries.
        lease = cfg.lock_ttl - min(0.05 * cfg.lock_ttl, 1.0)
        block_ms = max(1, int(min(cfg.read_block, REPLY_TIMEOUT / 2, lease / 2) * 1000))
        then = scripts.READ_AGAIN  # what the last read said to do next
        # A read sent ahead, before the previous batch was dispatched: (reply task, count asked).
        ahead: tuple[asyncio.Task[list[Any]], int] | None = None

        def read_ahead(got: int, asked: int) -> None:
            nonlocal ahead
            free = s.free_slots(got)
            if got >= asked and free > 0 and not s.stopping.is_set():
                count = min(s.read_count, free)
                ahead = (self._send(count, ">"), count)

        try:
            while not s.stopping.is_set():
                try:
                    if ahead is not None:
                        sent, asked = ahead
                        ahead = None
                    else:
                        free = s.free_slots()
                        if free <= 0:
                            # Full: read again once a slot is freed (or after read_block). Cleared
                            # before looking again, so a slot freed in between is not missed.
                            then = scripts.READ_AGAIN
                            freed = s.holdings.freed
                            freed.clear()
                            if s.free_slots() <= 0:
                                await wait_set(freed, cfg.read_block)
                            continue
                        if self.reply_lost:
                            # The last read's reply never arrived: the entries it
                            # delivered are in our pending list, held by our lease.
                            # Take them (with their recorded token) before reading more.
                            await self._take(self._send(s.capacity + s.read_count, "0"), "0")
                            self.reply_lost, self._lost_sent = False, math.inf
                        if self._idle_nudges >= IDLE_NUDGES:
                            # Nudge after nudge woke it to find its share still taken: its own
                            # nudges, perhaps, left for a peer that counts as idle but waits nowhere
                            # (one that just died, until its lease lapses). No busy loop.
                            await wait_set(s.stopping, SHARE_PAUSE)
                        asked = min(s.read_count, free)
                        # Drained, or fair dispatch left what waits to the idle peers it nudged:
                        # wait in the wake group, which an XADD or a nudge wakes.
                        wait = block_ms if then in (scripts.DRAINED, scripts.SHARE_TAKEN) else 0
                        sent = self._send(asked, ">", wait)
                    then = scripts.READ_AGAIN  # what a take that fails leaves: read again
                    refused_under = s.lease.takes  # the take a refused read was sent under, at most
                    then = await self._take(sent, ">", partial(read_ahead, asked=asked))
                except asyncio.CancelledError:
                    raise
                except ResponseError as exc:
                    if isinstance(classify(exc), LeaseLostError):
                        # The lease lapsed (a stall, a partition): nothing was read. The heartbeat's
                        # next tick takes it again; read again soon, not counted as a failed read.
                        s.log.debug("read refused: %s; reading again once the lease is back", exc)
                        await s.lease.taken_after(refused_under, cfg.heartbeat_every / 4)
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
                ahead[0].cancel()

    def _send(self, count: int, start: str, wait_ms: int = 0) -> asyncio.Task[list[Any]]:
        """Send one ``read-3.lua`` call: read up to ``count`` entries, held under our lease.

        With ``wait_ms``, a wait in the wake group (up to that long) goes
        first in the same write, and the read runs when it returns. The
        request is written before this returns (the task's first step runs at
        once); the task's result is the batch's replies.
        """
        s = self.state
        n = s.names
        args = (
            n.stream_key,
            n.fence_key,
            n.lease_key,
            n.group,
            n.id,
            count,
            s.lease.value,
            start,
            n.queued_key if self.dispatch is None else "",
            n.key_prefix,
            s.config.fair_window_ms,
            n.wake_group if start == ">" else "",
            n.nudge_key if start == ">" and s.config.fair_dispatch else "",
            n.tokens_key,
        )

        def build(b: CommandBatch) -> None:
            if wait_ms:
                scripts.wake_read(b, n.stream_key, n.wake_group, wait_ms, n.nudge_key)
            scripts.read(b, *args)

        # Before sending: sending can yield, and stop() must see that a wait is under way.
        self.blocked = wait_ms > 0
        sent = time.monotonic()
        # Re-reading our own pending entries ("0") takes nothing: safe to send twice.
        task = start_task(
            asyncio.get_running_loop(),
            s.link.read.execute(build, s.parser, retry_safe=start != ">"),
            "lbs-read",
        )
        self._sent_at[task] = sent
        if start == ">":
            self._reads[task] = count  # until taken: not room for an adoption
        else:
            # What is ours now (held, being finished or handed back) is not the lost reply's: a
            # stream finished while the re-read is under way is gone from all three by the time
            # its reply is read, though the re-read may still list it.
            self._tracked = self._ours()
        return task

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
        sent: asyncio.Task[list[Any]],
        start: str,
        before_dispatch: Callable[[int], None] | None = None,
    ) -> bytes:
        """Take the replies of a :meth:`_send`: its entries become held streams.

        Returns what to do next (``scripts.READ_AGAIN``, ``DRAINED``,
        ``SHARE_TAKEN``). ``before_dispatch(n)`` runs once ``n`` entries are
        in, before they are handed out (to send the next read).
        """
        waited = False
        sent_at = self._sent_at.get(sent, math.inf)
        if start != ">":
            sent_at = min(sent_at, self._lost_sent)  # a re-read takes what the lost reply held
        try:
            try:
                replies = await sent
            except BaseException:
                # Wire returns server errors as values: anything raised here (I/O,
                # cancellation) may have lost a reply whose entries are now pending to us.
                self.lose_reply(sent_at)
                raise
            finally:
                self.blocked = False
            reply = replies[-1]
            waited = len(replies) > 1
            nudged = waited and _nudge_in(replies[0], self.state.names.nudge_key)
            if isinstance(reply, NoScriptError) and waited:
                # The wait ran, the read did not (a SCRIPT FLUSH, a failover): load and read again.
                await self.state.link.read.load_scripts()
                return scripts.READ_AGAIN
            if isinstance(reply, Exception):
                raise reply
            raw_entries, tokens, then = reply
            idle = nudged and not raw_entries and bytes(then) == scripts.SHARE_TAKEN
            self._idle_nudges = self._idle_nudges + 1 if idle else 0
            if raw_entries:
                if before_dispatch is not None:
                    before_dispatch(len(raw_entries))
                await self.intake.hand_out(
                    raw_entries, tokens, start, sent_at, self.dispatch, self._skipped(start)
                )
            if waited and isinstance(replies[0], Exception):
                # The wait failed (NOGROUP: the wake group is gone), the read did not.
                raise replies[0]
            return bytes(then)
        finally:
            self._reads.pop(sent, None)
            self._sent_at.pop(sent, None)

    def lose_reply(self, sent: float = math.inf) -> None:
        """A reply to a write sent at ``sent`` (monotonic; inf: unknown) was lost: the next read re-reads
        and takes what it had taken, as far as the lease it was read under lasts."""
        self.reply_lost = True
        self._lost_sent = min(self._lost_sent, sent)

    @property
    def queues(self) -> bool:
        """Whether what this client takes waits for the application (the notification API) rather than
        starting a handler at once (``run()``)."""
        return self.dispatch is None

    def adoption_room(self) -> int:
        """How many streams recovery may adopt for this client now: its free slots less what its reads in
        flight may take, and under the notification API no more than its mailbox has room for."""
        s = self.state
        if s.stopping.is_set() or self.task is None:
            return 0
        reads = sum(self._reads.values())  # what the reads in flight may bring
        free = s.free_slots() - reads
        if self.dispatch is None:
            free = min(free, s.mailbox.room - reads)
        return max(0, free)

    async def adopt(self, entries: list[Entry], tokens: list[Any], sent: float) -> None:
        """Take entries recovery adopted from a dead holder (``reap-4.lua``, sent at ``sent``, monotonic):
        pending to this consumer, held by our lease with a fresh token, handed out as a read's are."""
        await self.intake.hand_out(entries, tokens, ">", sent, self.dispatch, (), adopted=True)

    def adoption_lost(self, sent: float) -> None:
        """An adoption's reply (sent at ``sent``) was lost: what it adopted is pending to us, held by
        our lease; the next read re-reads and takes it, as after a lost read reply."""
        self.lose_reply(sent)

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
            "read failed (%s: %s); retry %d in %.2fs", type(exc).__name__, exc, failures, wait
        )
        await backoff.sleep(s.stopping, wait)
        return True

    async def stop(self) -> None:
        """End the reader without losing a read batch (``state.stopping`` must be set).

        A wait in the wake group is woken with CLIENT UNBLOCK (it returns as
        if it timed out; the read behind it runs), and a reader busy taking a
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
