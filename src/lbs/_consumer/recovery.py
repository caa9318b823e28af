"""Recovery: dead consumers' streams go back into circulation, living ones are never robbed.

An entry pending to a consumer is held while that consumer's lease ``{<service>-input}:lease:<id>``
lives. Every re-queue is one call of ``requeue-6.lua`` in mode ``absent``: it acts only when the
lease of the consumer the entry is pending to does not exist, acks first (0 acked means another
recoverer won), then writes the fresh entry (or the dead letter) and deletes the old one, atomically.
Any number of recoverers re-queue an entry exactly once. Three paths find the entries:

* **deadline poller** (fast, does not depend on Redis's expiry timing): every consumer has a
  deadline in the sorted set ``{<service>-input}:deadlines``, moved by each heartbeat tick; at the
  earliest deadline in the index (``reap-3.lua`` returns it), never twice within
  ``deadline_poll_interval``, the script looks at each overdue consumer's lease (its PTTL expires an
  overdue lease on the spot) and, where it is gone, lists its pending entries, which are re-queued
  under new ids: recovery never takes an entry over under its id (no XCLAIM), so an id is only ever
  pending to the consumer that read it, which the Lua-free done relies on (a holder that wakes from a
  stall acks its old id, which the re-queue has made moot). A live consumer whose lease lapsed puts
  its own streams back (its heartbeat; its own recovery, when it finds them first, with no retry).
  Sleeping until the earliest deadline is exact (deadlines only move forward), and the stall test
  (below) bounds the sleep (:meth:`Recovery.stall_ms`);
* **keyspace listener** (fast, when Redis delivers): ``expired`` events of this service's leases, on
  a Pub/Sub connection that is PINGed and replaced when it drops or goes half-open, wake the deadline
  poller, which alone judges. Beside a Go fleet (``Config.go_compatible``) it also hears Go-style
  locks expire, and each time it subscribes it scans the entries idle past Go's claim idle (2 s);
* **scan** (the backstop: missed events, consumers not in the index, restarts): at start and every
  ``reconciliation_interval``, XPENDING ``IDLE min_idle`` paged by cursor, one EXISTS per holder's
  lease per page, re-queue only where it is gone (beside a Go fleet, the Go-style lock too, and
  ``GO_DONE_GAP`` after that look: ``golocks.go_unlocked``).

After a stall of the server every deadline and lease lapses at once although the holders live;
``reap-3.lua`` notices the gap since its last call and gives every overdue consumer a grace of one
lease TTL instead. At start the client re-queues what an earlier process under its consumer id left.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from _lbscore import CommandBatch

from .. import _keys
from .._redis import clock, peek, pending, scripts
from .._redis.connection import execute
from .._redis.subscription import Subscription
from .._redis.wire import text
from .._waits import wait_set
from ..config import GO_CLAIM_IDLE
from .activity import Activity
from .backoff import Backoff
from .golocks import go_unlocked
from .requeue import Requeue
from .state import ClientState
from .topology import Topology

__all__ = ["Recovery", "poll_wait"]

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


def poll_wait(due: float | None, every: float, cap: float) -> float:
    """Seconds until the next poll: a few ms past the earliest deadline (``due``; ``None``: none), at
    least ``every``, at most ``cap`` unless ``every`` is longer (a poller turned off stays off)."""
    return max(every, cap if due is None else min(cap, due + 0.002))


class Recovery(Activity):
    """The recovery tasks of one client; the one caller of ``reap-3.lua``. Re-queues go through :class:`Requeue`."""

    def __init__(
        self,
        state: ClientState,
        requeue: Requeue,
        topology: Topology,
        sweep: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.state = state
        self.requeue = requeue
        self.topology = topology
        #: Housekeeping that runs with each scan: departed consumers forgotten (``Instance.forget_departed``).
        self.sweep = sweep
        self._next_due: float | None = None  # seconds to the earliest deadline, after a poll
        #: The poll time the last look without Lua read or reap-3.lua wrote (None: none, or it failed).
        self._seen: bytes | None = None
        self._clock = clock.ServerClock()
        self.config = state.config
        self.tasks: list[asyncio.Task[None]] = []
        self.listening = asyncio.Event()  # set while the keyspace listener is subscribed
        self._wake = asyncio.Event()  # set: the deadline loop polls now, not at its next interval
        self._heard = False  # the keyspace listener heard a lease expire since the last poll
        self._go_catch_up: asyncio.Task[None] | None = None

    def start(self) -> None:
        make = asyncio.create_task
        consumer = self.state.names.id
        self.tasks.append(make(self._scan_loop(), name=f"lbs-scan-{consumer}"))
        self.tasks.append(make(self._deadline_loop(), name=f"lbs-deadlines-{consumer}"))
        if self.config.keyspace_recovery:
            self.tasks.append(make(self._keyspace_loop(), name=f"lbs-keyspace-{consumer}"))

    def running(self) -> list[asyncio.Task[Any] | None]:
        return [*self.tasks, self._go_catch_up]

    async def stop(self) -> None:
        await super().stop()
        self.tasks = []

    # ------------------------------------------------------------ deadlines ---

    async def _deadline_loop(self) -> None:
        """Poll at the earliest deadline, at once when the keyspace listener hears a lease expire, and
        again at once after a poll that re-queued something: a dead holder of 100,000 streams is
        emptied ``deadline_batch`` at a time back to back, not one batch per interval."""
        every = self.config.deadline_poll_interval
        cap = self.stall_ms() / 2000  # idle: every 2.5 s by default
        wake = self._wake
        soon = True  # the first poll and the one after a failure: after the interval
        while True:
            if not wake.is_set():
                await wait_set(wake, every if soon else poll_wait(self._next_due, every, cap))
            if self.state.stopping.is_set():
                return
            timed = not wake.is_set() and not soon  # the timer's poll, not a wake or a retry
            path = "keyspace" if self._heard else "deadline"
            self._heard = False
            wake.clear()
            soon = False
            try:
                if timed and await self.nothing_due():
                    continue
                if await self.poll_deadlines(path):
                    wake.set()  # more may be due: poll again at once
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                soon = True  # try again after the interval, whatever the last reply said
                if not self.state.denied(exc, "polling the consumer deadlines"):
                    self.state.log.debug("deadline poll failed: %s", exc)

    def stall_ms(self) -> int:
        """A gap since the last poll by any recoverer longer than this is a stall: half a TTL (a live
        holder's deadline lapses after two thirds of one), at least 1 s and four of our intervals.
        Each poller calls at least every half of it, so any one live poller keeps the gap short and a
        death the keyspace events miss is judged at its deadline, not one grace later."""
        cfg = self.config
        return max(1000, cfg.lock_ttl_ms // 2, int(4000 * cfg.deadline_poll_interval))

    async def nothing_due(self) -> bool:
        """The timer's poll on an idle fleet, without Lua: True when no consumer is past its deadline
        and the last poll's time (``{<service>-input}:reaped``, the stall test's) is recent, so
        ``reap-3.lua`` would only have written that time. One pipeline of ``TIME``, ``GET`` of the
        time and the earliest deadline (:mod:`lbs._redis.peek`). Where the server has ``SET ...
        IFEQ`` the same pipeline first moves the time on, when a quarter of the stall threshold has
        gone by since the value this poller's previous look read, and only if no poller wrote it
        since; the value is the server's time as that look's ``TIME`` tells it, at the moment the
        pipeline is sent: a stall of the server after that still reads as one.
        False (call the script) when anything is due, the time is old or missing, or a reply is not
        what it should be: the script judges, and names what is wrong."""
        s = self.state
        n = s.names
        stall_ms = self.stall_ms()
        sent = time.monotonic()
        seen, self._seen = self._seen, None
        now_ms = self._clock.now_ms(sent)
        move: tuple[int, bytes] | None = None  # (the time to write, the value it replaces)
        if seen is not None and now_ms is not None and s.server.set_ifeq:
            move = (now_ms, seen) if stall_ms // 4 <= now_ms - int(seen) <= stall_ms else None

        def build(b: CommandBatch) -> None:
            if move is not None:
                b.command("SET", n.reaped_key, move[0], "IFEQ", move[1])
            peek.peek(b, [n.consumers_key], [n.reaped_key])

        try:
            replies = await s.link.pool.execute(build, retry_safe=True)
            look = peek.peek_reply(replies[1:] if move else replies, zsets=1, gets=1)
            (last_raw,) = look.values
            now = look.now_ms
            if last_raw is None or now is None:  # (a timed peek always has the time)
                return False
            last = int(last_raw)
        except (RedisError, ValueError, TypeError):
            return False
        self._seen = last_raw
        self._clock.pin(now, sent, time.monotonic())
        due = look.due_in()
        if due == 0 or now - last > stall_ms:
            return False
        self._next_due = due
        # Without SET ... IFEQ the script writes the time, atomically with its look.
        return s.server.set_ifeq or now - last < stall_ms // 4

    async def poll_deadlines(self, path: str = "deadline") -> int:
        """One poll of the deadline index; returns how many entries it re-queued.

        The one judge of "this consumer is dead": the keyspace listener calls
        it too (``path="keyspace"``) when a lease expires, so a lease that
        lapsed while its holder lives (a stall of the server) never has its
        entries taken here; the holder's heartbeat puts them back, without a
        retry.
        """
        s = self.state
        n, cfg = s.names, self.config
        ttl_ms = cfg.lock_ttl_ms
        stall_ms = self.stall_ms()

        def build(b: CommandBatch) -> None:
            scripts.reap(
                b,
                n.consumers_key,
                n.stream_key,
                n.reaped_key,
                group=n.group,
                lease_prefix=n.lease_prefix,
                batch=cfg.deadline_batch,
                stall_ms=stall_ms,
                grace_ms=ttl_ms,
                tokens_prefix=n.tokens_prefix,
            )

        (reply,) = await s.link.pool.execute(build, s.parser)
        if isinstance(reply, Exception):
            raise reply
        reaped = scripts.reap_reply(reply)
        self._seen, self._next_due = reaped.stamp, reaped.next_due
        held = reaped.held  # the ids, and who held them
        # Our own, found while this process lives (its lease lapsed in a stall): not a death.
        own = {i: v for i, v in held.items() if v[0] == n.id}
        requeued = 0
        if own:
            requeued += await self.requeue.recover(
                own, path, f"this consumer's lease lapsed ({path})", count_retry=False
            )
        requeued += await self.requeue.recover(
            {i: v for i, v in held.items() if v[0] != n.id},
            path,
            f"lease expired ({path}: deadline passed)",
        )
        return requeued

    # ------------------------------------------------------------- keyspace ---

    def _channel_pattern(self, go: bool = False) -> str:
        """Our leases' keyspace channels; ``go`` (``Config.go_compatible``): the Go reference client's
        lock keys (any service's: the entry is looked up in our LBS before anything is done)."""
        db = int(self.state.link.redis.connection_pool.connection_kwargs.get("db", 0) or 0)
        keys = _keys.GO_MUTEX_KEY_SEP if go else self.state.names.lease_prefix
        return f"__keyspace@{db}__:{'*' if go else ''}" + _GLOB_SPECIAL.sub(r"\\\1", keys) + "*"

    async def _keyspace_loop(self) -> None:
        """Listen for this service's lease expirations; reconnect on drops and half-open links.

        Messages are read in bulk (:class:`lbs._redis.subscription.Subscription`): a burst of
        expiries wakes the deadline poller once and costs the client about a microsecond each."""
        s = self.state
        pattern = self._channel_pattern()
        ours = pattern.encode()
        prefix_len = len(ours) - 1  # the channel minus the trailing '*'
        patterns = (
            [pattern, self._channel_pattern(go=True)] if self.config.go_compatible else [pattern]
        )
        backoff = Backoff(self.config.read_retry_initial, self.config.read_retry_max)
        ping_every = self.config.pubsub_ping_interval
        first = True
        lost_at: float | None = None
        while not s.stopping.is_set():
            link = s.link
            sub = Subscription(link.redis)  # on the slot's owner: where the leases expire
            try:
                await sub.open(*patterns)
                if not first:
                    s.hooks.metric("keyspace_listener_reconnects_total", 1)
                    await self.topology.check_server()  # a restart forgets the keyspace events
                if lost_at is not None:
                    # How long recovery relied on the deadline poller and the scan alone.
                    s.hooks.metric("keyspace_listener_gap_seconds", time.monotonic() - lost_at)
                    lost_at = None
                first = False
                self.listening.set()
                backoff.reset()
                if self.config.go_compatible:
                    self._catch_up_go()
                while True:
                    messages = await sub.heard(ping_every)
                    expired: bytes | None = None
                    for msg in messages:
                        if (
                            type(msg) is list
                            and len(msg) == 4
                            and msg[0] == b"pmessage"
                            and msg[3] == b"expired"
                        ):
                            if msg[1] == ours:
                                expired = expired or msg[2]
                            else:
                                await self._on_go_expired(
                                    text(msg[2], "replace").rpartition(_keys.GO_MUTEX_KEY_SEP)[2]
                                )
                    if expired is not None:
                        await self._on_expired(text(expired[prefix_len:], "replace"))
                    if s.link is not link:
                        raise ConnectionError(
                            f"the slot moved to {s.link.node}: resubscribing there"
                        )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                if lost_at is None:
                    lost_at = time.monotonic()
                await self.topology.after_failure(exc)
                if s.link is not link:
                    backoff.reset()  # the new owner is known: go at once
                wait = backoff.next()
                s.log.warning("keyspace listener lost (%s); resubscribing in %.2fs", exc, wait)
                await asyncio.sleep(wait)
            finally:
                self.listening.clear()
                try:
                    await sub.close()
                except Exception:
                    pass

    def _catch_up_go(self) -> None:
        """Each time the listener (re)subscribes beside a Go fleet: Go-style locks that expired while it
        was not listening sent events nobody heard, and nothing else in lbs knows when a Go holder dies
        (Go writes no deadline). A scan of the entries idle past the Go client's own claim idle
        (``hbInterval``, 2 s), lock-checked like every scan (requeue-6 also checks the Go-style lock),
        takes their place."""
        if self._go_catch_up is None or self._go_catch_up.done():
            self._go_catch_up = asyncio.create_task(
                self._go_scan(), name=f"lbs-go-catch-up-{self.state.names.id}"
            )

    async def _go_scan(self) -> None:
        try:
            await self.scan(min_idle=GO_CLAIM_IDLE)
        except RedisError as exc:
            self.state.log.warning("Go-style locks' catch-up scan failed (%s); the next will", exc)

    async def _on_go_expired(self, entry_id: str) -> None:
        """A Go consumer's lock expired (``Config.go_compatible``): its holder stopped extending it.
        If the entry is pending in our LBS, recover it (requeue-6 checks its holder's lease and the
        Go-style lock first)."""
        s = self.state
        n = s.names
        try:
            p = await s.link.redis.xpending_range(
                n.stream_key, n.group, min=entry_id, max=entry_id, count=1
            )
            if not p:
                return  # another service's entry, or finished
            reason = "a Go consumer's lock expired (keyspace)"
            await self.requeue.recover(_holders(p), "keyspace", reason)
        except RedisError as exc:
            s.log.warning("re-queue of %s after its Go lock expired failed: %s", entry_id, exc)

    async def _on_expired(self, consumer: str) -> None:
        """A consumer's lease expired: wake the deadline loop (it re-queues that consumer's entries).

        Only the first of a burst (the loop not woken yet) looks up how late Redis announced it, for
        ``recovery_expiry_lag_seconds``.
        """
        s = self.state
        first = not self._wake.is_set()
        self._heard = True
        self._wake.set()
        if not first:
            return
        r, n = s.link.redis, s.names
        try:
            # The consumer's deadline is its last heartbeat's; the lease expires no later.
            deadline = await r.zscore(n.consumers_key, consumer)
        except RedisError as exc:
            s.log.debug(
                "looking up the deadline of %s after its lease expired failed: %s", consumer, exc
            )
            return
        if deadline is not None:
            # How late Redis announced the expiry, against the lease's deadline.
            s.hooks.metric("recovery_expiry_lag_seconds", max(0.0, time.time() - deadline / 1000))

    # ----------------------------------------------------------------- scan ---

    async def _scan_loop(self) -> None:
        s = self.state
        interval = s.strategy.reconciliation_interval or self.config.reconciliation_interval
        while not s.stopping.is_set():
            try:
                await self.topology.check_server()
                await self.scan()
                if self.sweep is not None:
                    await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                s.log.warning("recovery scan failed: %s", exc)
            await wait_set(s.stopping, random.uniform(0.9 * interval, 1.1 * interval))

    async def _dead_of(self, held: dict[str, tuple[str, str]]) -> list[str]:
        """Those of ``held`` (entry id: holder, deadline) whose holder's lease does not exist: one EXISTS
        per holder, not per entry (one round trip)."""
        s = self.state
        prefix = s.names.lease_prefix
        holders = list({h for h, _ in held.values()})
        pipe = s.link.redis.pipeline(transaction=False)
        for holder in holders:
            pipe.exists(prefix + holder)
        alive = {h for h, e in zip(holders, await execute(pipe) if holders else []) if e}
        return [i for i, (h, _) in held.items() if h not in alive]

    async def _pages(
        self, idle_ms: int | None = None, consumer: str | None = None
    ) -> AsyncIterator[dict[str, tuple[str, str]]]:
        """The pending list (or one consumer's part of it), page by page (entry id: holder, ""), with an
        exclusive cursor."""
        s = self.state
        n = s.names
        async for page in pending.pages(
            s.link.redis,
            n.stream_key,
            n.group,
            self.config.scan_batch,
            idle_ms=idle_ms,
            consumer=consumer,
        ):
            yield _holders(page)

    async def scan(self, min_idle: float | None = None) -> dict[str, int]:
        """One full pass over the pending list; returns counts (requeued, alive, pending).

        Pages with an exclusive cursor, so a page of slow-but-alive entries
        never hides dead ones behind it.
        """
        s = self.state
        started = time.perf_counter()
        idle_ms = int((self.config.scan_min_idle if min_idle is None else min_idle) * 1000)
        requeued = alive = seen = 0
        async for held in self._pages(idle_ms=idle_ms):
            ids = list(held)
            seen += len(ids)
            dead = await self._dead_of(held)
            if dead and self.config.go_compatible:  # no Go-style lock either, GO_DONE_GAP ago
                dead = await go_unlocked(self.state, dead)
            alive += len(ids) - len(dead)
            if dead:
                gone = {i: held[i] for i in dead}  # and who held them
                requeued += await self.requeue.recover(gone, "scan", "lease gone (scan)")
        s.hooks.metric("recovery_scan_skipped_alive_total", alive)
        s.hooks.metric("recovery_scan_duration_seconds", time.perf_counter() - started)
        depth = (await s.link.redis.xpending(s.names.stream_key, s.names.group))["pending"]
        s.hooks.metric("pel_depth", depth)
        return {"requeued": requeued, "alive": alive, "pending": seen}

    async def startup(self) -> int:
        """Re-queue this consumer id's own pending entries: an earlier process's under this consumer id (a
        restart), whose lease lapsed before this one's was taken (:meth:`Instance.take` waits for it).

        Runs when the client starts, before the reader: nothing pending to this id is this process's.
        Each death counts as the deadline poller's would (``restart`` mode: the entry must be pending to us
        under our lease, as it is).
        """
        s = self.state
        started = time.perf_counter()
        ok = 0.0
        total = 0
        try:
            table = s.holdings.table
            async for ids in self._pages(consumer=s.names.id):
                dead = [i for i in ids if i not in table]
                total += await self.requeue.recover(
                    dead, "startup", "an earlier process's (startup recovery)", mode="restart"
                )
            ok = 1.0
        finally:
            s.hooks.metric("startup_recovery_duration_seconds", time.perf_counter() - started)
            s.hooks.metric("startup_recovery_success", ok)
        return total


def _holders(pending: Any) -> dict[str, tuple[str, str]]:
    """An XPENDING page's entries and their holders (deadline unknown: "")."""
    return {text(p["message_id"]): (text(p["consumer"]), "") for p in pending}
