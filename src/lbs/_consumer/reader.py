"""The reader: read and lock assignments in one ``read-3.lua`` call, and hand them out.

Delivery and locking are one atomic script, so no entry is ever pending
without a lock, nor a lock without this consumer's place in the deadline
index: whenever this consumer dies, the deadline poller brings its work back
within the lock TTL. Each batch is parsed in the compiled core (entries come
back as ``Entry`` objects); good entries become held streams and go to the
runner (under ``run()``) or the mailbox as STREAM_ADDED; malformed ones are
dead-lettered.

After a full batch the next read is sent before the batch is handed out
(when capacity allows both), so Redis reads and locks the next batch while
this one is dispatched. A read that drained the group is followed by a wait
and a read in one write: a blocking ``XREADGROUP`` of the wake group
(``<service>-wake``, NOACK, one entry) and the ``read-3.lua`` call behind it,
which Redis runs the moment the wait returns. So an XADD wakes one consumer,
which reads and locks in the same turn of the server's loop: one round trip
per wake-up, as a plain ``XREADGROUP BLOCK`` loop has, and no read just to
learn where the stream ends. ``CLIENT UNBLOCK`` wakes the wait at shutdown
(the read behind it still runs, and what it takes is handed back).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from redis.exceptions import NoScriptError, RedisError, ResponseError

from _lbscore import CommandBatch, Entry, Held

from .. import _keys
from .._redis import scripts
from .._redis.connection import cancel_and_wait
from .._redis.errors import NoGroupError, classify
from .._redis.wire import REPLY_TIMEOUT, text
from .._waits import wait_set
from ..notifications import Notification, NotificationType
from .activity import Activity
from .backoff import Backoff
from .finisher import Finisher
from .requeue import Requeue
from .runner import start_task
from .state import ClientState
from .topology import Topology

__all__ = ["Reader"]


class Dispatch(Protocol):
    """Where taken streams go under ``run()`` (:meth:`lbs._consumer.runner.Runner.dispatch`)."""

    def __call__(self, h: Held, note: Notification) -> None: ...


class Reader(Activity, kind="reader"):
    """The reading task of one client; the one caller of ``read-3.lua``."""

    def __init__(
        self, state: ClientState, finisher: Finisher, requeue: Requeue, topology: Topology
    ) -> None:
        self.state, self.finisher, self.requeue, self.topology = state, finisher, requeue, topology
        #: Under run(): the runner's dispatch, which starts a handler per taken stream.
        self.dispatch: Dispatch | None = None
        self._claim_arg = ""  # read-3.lua's CLAIM min-idle (ms), "" for none
        #: In a wait of the wake group now (CLIENT UNBLOCK wakes it).
        self.blocked = False
        #: A read's reply was lost: re-read (and adopt) our own pending entries before reading more.
        self.reply_lost = False
        self._reads: dict[
            asyncio.Task[list[Any]], int
        ] = {}  # reads of new entries in flight: how many each asked
        self._tracked: set[str] = set()  # what was ours when the last re-read was sent

    def start(self) -> None:
        claim_ms = self.state.strategy.claim_min_idle_ms
        self._claim_arg = "" if claim_ms is None else str(claim_ms)
        super().start()

    async def _main(self) -> None:
        s = self.state
        cfg = s.config
        failures = 0
        backoff = Backoff(cfg.read_retry_initial, cfg.read_retry_max)
        # Within the wire's reply watchdog, with room for the read behind the wait.
        block_ms = max(1, int(min(cfg.read_block, REPLY_TIMEOUT / 2) * 1000))
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
                        if free <= 0 or then == scripts.SHARE_TAKEN:
                            # Full, or fair dispatch left what waits to idle peers: read
                            # again once a slot is freed (or after read_block).
                            then = scripts.READ_AGAIN
                            freed = s.holdings.freed
                            freed.clear()
                            await wait_set(freed, cfg.read_block)
                            continue
                        if self.reply_lost:
                            # The last read's reply never arrived: the entries it
                            # delivered are in our pending list under locks with our
                            # id. Adopt them before reading more.
                            await self._take(self._send(s.capacity + s.read_count, "0"), "0")
                            self.reply_lost = False
                        asked = min(s.read_count, free)
                        wait = block_ms if then == scripts.DRAINED else 0
                        sent = self._send(asked, ">", wait)
                    then = scripts.READ_AGAIN  # what a take that fails leaves: read again
                    then = await self._take(sent, ">", partial(read_ahead, asked=asked))
                except asyncio.CancelledError:
                    raise
                except ResponseError as exc:
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
                # Stopped with a read in flight: its entries are locked for us.
                # Take them (so close() hands them back) rather than leave their
                # locks to expire.
                sent, ahead = ahead[0], None
                await self._take(sent, ">")
        finally:
            if ahead is not None:
                # Cancelled or given up with a read in flight: recovery brings
                # its entries back once their locks expire.
                self.reply_lost = True
                ahead[0].cancel()

    def _send(self, count: int, start: str, wait_ms: int = 0) -> asyncio.Task[list[Any]]:
        """Send one ``read-3.lua`` call: read up to ``count`` entries and lock them.

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
            n.consumers_key,
            n.group,
            n.id,
            count,
            s.config.lock_ttl_ms,
            n.lock_prefix,
            start,
            self._claim_arg,
            n.lock_owner,
            s.server.msetex,
            _keys.GO_MUTEX_KEY_SEP if s.config.go_compatible else "",
            n.queued_key if self.dispatch is None else "",
            n.key_prefix,
            s.config.fair_window_ms,
            n.wake_group if start == ">" else "",
        )

        def build(b: CommandBatch) -> None:
            if wait_ms:
                scripts.wake_read(b, n.stream_key, n.wake_group, wait_ms)
            scripts.read(b, *args)

        # Before sending: sending can yield, and stop() must see that a wait is under way.
        self.blocked = wait_ms > 0
        # Re-reading our own pending entries ("0") takes nothing: safe to send twice.
        task = start_task(
            asyncio.get_running_loop(),
            s.link.read.execute(build, s.parser, retry_safe=start != ">"),
            "lbs-read",
        )
        if start == ">":
            self._reads[task] = count  # until taken: not room for an adoption
        else:
            # What is ours now (held, being finished or handed back) is not the lost reply's: a
            # stream finished while the re-read is under way is gone from all three by the time
            # its reply is read, though the re-read may still list it.
            self._tracked = self._ours()
        return task

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
        try:
            try:
                replies = await sent
            except BaseException:
                # Wire returns server errors as values: anything raised here (I/O,
                # cancellation) may have lost a reply whose locks are now ours.
                self.reply_lost = True
                raise
            finally:
                self.blocked = False
            reply = replies[-1]
            waited = len(replies) > 1
            if isinstance(reply, NoScriptError) and waited:
                # The wait ran, the read did not (a SCRIPT FLUSH, a failover): load and read again.
                await self.state.link.read.load_scripts()
                return scripts.READ_AGAIN
            if isinstance(reply, Exception):
                raise reply
            raw_entries, tokens, then = reply
            if raw_entries:
                if before_dispatch is not None:
                    before_dispatch(len(raw_entries))
                await self._hand_out(raw_entries, tokens, start)
            if waited and isinstance(replies[0], Exception):
                # The wait failed (NOGROUP: the wake group is gone), the read did not.
                raise replies[0]
            return bytes(then)
        finally:
            self._reads.pop(sent, None)

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

    async def adopt(self, entries: list[Entry], tokens: list[Any]) -> None:
        """Take entries recovery adopted from a dead holder (``reap-4.lua``): pending to this consumer
        under fresh locks of ours, handed out as a read's are."""
        await self._hand_out(entries, tokens, ">", adopted=True)

    def adoption_lost(self) -> None:
        """An adoption's reply was lost: what it adopted is pending to us under our locks; the next read
        re-reads and takes it, as after a lost read reply."""
        self.reply_lost = True

    async def _hand_out(
        self, raw_entries: list[Any], tokens: list[Any], start: str, adopted: bool = False
    ) -> None:
        """Entries read (or adopted) and their tokens become held streams, handed to the runner or the
        mailbox; the malformed and those out of retries are dead-lettered."""
        s = self.state
        owner = s.names.lock_owner
        table = s.holdings.table
        bad: list[tuple[Entry, str, str]] = []  # (entry, our lock value, reason): to dead-letter
        max_retries = s.config.max_retries
        hooks = s.hooks
        acquired, started = (
            hooks.listening("lbs_lock_acquired"),
            hooks.listening("lbs_stream_started"),
        )
        batch: list[Notification] | None = [] if hooks.listening("lbs_streams_started") else None
        dispatch, stats, holder = self.dispatch, s.stats, s.owner
        # The journal's "retaken": a re-queued copy taken (an adopted entry is journalled as recovered).
        retaken = s.journal.retaken if s.journal.on and not adopted else None
        taken_at = time.monotonic()
        # Re-reading our pending entries: those we track, now or when the re-read was sent, are not
        # to be taken again.
        ours = self._ours() | self._tracked if start != ">" else ()
        queued = dispatch is None and start == ">"  # a re-read ("0") adds nothing to the queued set
        waiting = 0
        for e, tok in zip(raw_entries, tokens):
            tok = self._own_token(tok, owner)
            if not isinstance(tok, int):
                if tok.startswith("WAIT "):
                    # Its data stream is held under another registration: parked in the
                    # name's waiting list, back in the LBS once the holder releases it.
                    waiting += 1
                    s.log.debug(
                        "entry %s (%s) waits: its data stream is held under entry %s",
                        e.id,
                        e.stream,
                        tok[5:],
                    )
                elif tok.startswith("WRONGTYPE"):
                    # Not a lock at all: the entry stays pending, and the scan
                    # brings it back once the key is removed.
                    kind, _, key = tok[10:].partition(" ")
                    s.log.error(
                        "entry %s: %s holds a value of the wrong type (%s); leaving the entry pending "
                        "until the key is removed",
                        e.id,
                        key or f"its lock key {s.names.lock_key_prefix + e.id}",
                        kind,
                    )
                elif start == ">":
                    # Someone holds this entry's lock (a slow holder whose entry
                    # was claimed away): leave it pending; it is theirs.
                    s.log.warning("entry %s is locked by %r; leaving it to its holder", e.id, tok)
                continue
            if e.id in table or e.id in ours:
                continue  # re-read: already ours, or being finished or handed back
            if e.error is not None:
                bad.append((e, f"{tok}:{owner}", str(e.error)))
                continue
            retry_count = e.retry_count
            if e.claimed:
                # Claimed (XREADGROUP CLAIM) from holders that stopped: the
                # count of earlier deliveries is the count of failed attempts.
                retry_count += e.delivery_count
                if 0 <= max_retries < retry_count:
                    bad.append(
                        (
                            e,
                            f"{tok}:{owner}",
                            f"out of retries: {e.retry_count} re-queued, "
                            + (
                                f"{e.delivery_count} holders died running it (adopted once their locks expired)"
                                if adopted
                                else f"{e.delivery_count} deliveries (claimed)"
                            ),
                        )
                    )
                    continue
            # Queued for the application (no run()): read-3 put it in our queued set until it is taken.
            # read-3 never queues a claimed entry (it counts as running from delivery); reap-4 queues all it adopts.
            h = table.take(e, tok, retry_count, taken_at, queued and (adopted or not e.claimed))
            stats.taken += 1
            if retaken is not None and e.original_id is not None:
                retaken(h, e.original_id)
            if acquired:
                hooks.notify(
                    "lbs_lock_acquired", stream=h.stream, entry_id=h.entry_id, token=h.token
                )
            # e.info, not h.info: an empty Info then costs the held record no dict.
            note = Notification(
                NotificationType.STREAM_ADDED, e.stream, e.id, e.info, retry_count, tok, "", holder
            )
            if started:
                hooks.notify("lbs_stream_started", notification=note)
            if batch is not None:
                batch.append(note)
            if dispatch is not None:
                dispatch(h, note)
            else:
                await s.mailbox.put(note)
        if waiting:
            hooks.metric("streams_waiting_total", waiting)
        if batch:
            hooks.notify("lbs_streams_started", notifications=batch)
        if bad:
            await self.requeue.dead_letter(bad)

    @staticmethod
    def _own_token(tok: Any, owner: str) -> int | str:
        """The token of a lock that is ours, else the lock's value as text.

        A retried take (its first reply was lost with the connection) finds
        the locks the first attempt set: "<token>:<our id>:<our instance>".
        Only this very process's locks are adopted: another process started
        with the same consumer id (refused at start, but possible by hand)
        reads from the same pending list, and its locks stay its own.
        """
        if isinstance(tok, int):
            return tok
        value = text(tok, "replace")
        token, _, holder = value.partition(":")
        if holder == owner and token.isdigit():
            return int(token)
        return value

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
        if it timed out; the read behind it runs), and a reader busy taking
        locks finishes that batch, so every entry it read is either held (and
        handed back) or untouched. Cancelling is the last resort, after one
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
