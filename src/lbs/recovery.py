"""Recovery: dead consumers' streams go back into circulation, living ones are never robbed.

Every re-queue is one call of ``requeue-3.lua`` with lock mode ``absent``:
it acts only when the lock does not exist, acks first (0 acked means another
recoverer won: nothing else happens), then writes the fresh entry (or the
dead letter) and deletes the old one, atomically. Any number of recoverers,
on any number of consumers, re-queue an entry exactly once.

Three paths find the entries to re-queue:

* **deadline poller** (fast, does not depend on Redis's expiry timing):
  every consumer holding locks has a deadline in the sorted set
  ``{<service>-input}:consumers``, moved by each heartbeat tick; every
  ``deadline_poll_interval`` the ``reap-3.lua`` script lists the pending
  entries of consumers past their deadline whose lock is gone (its PTTL
  expires an overdue lock on the spot). A live consumer re-queues its own
  lost locks when its heartbeat finds them (path ``heartbeat``);
* **keyspace listener** (fast, when Redis delivers): ``expired`` events of
  this service's lock keys, on a Pub/Sub connection that is PINGed and
  replaced when it drops or goes half-open, wake the deadline poller, which
  alone judges whether the holder is dead;
* **scan** (the backstop for everything else: missed events, locks taken by
  other clients, restarts): at start and every ``reconciliation_interval``,
  XPENDING ``IDLE min_idle`` paged by cursor, one EXISTS round trip per page,
  re-queue only where the lock is gone.

After a stall of the server every deadline and lock lapses at once although
the holders live; ``reap-3.lua`` notices the gap since its last call and
gives every overdue consumer a grace of one lock TTL instead, and the live
holders re-queue their lost locks themselves with no retry counted.

At start the client also re-queues its own pending entries (a restart under
the same consumer id) whose locks are gone.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from _lbscore import try_decode_input

from . import _keys
from ._connection import cancel_and_wait, execute
from ._scripts import RequeueCode
from .notifications import Notification, NotificationType

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Recovery"]

_GLOB_SPECIAL = re.compile(r"([\\*?\[\]])")


class Recovery:
    """The recovery tasks of one :class:`lbs.Client`."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.config = client.config
        self.lock_prefix = _keys.lock_key(client.service, "")
        self.reaped_key = _keys.reaped_key(client.service)
        self.tasks: list[asyncio.Task[None]] = []
        #: Counters by metric name, also sent to ``lbs_metric`` (handy in tests and the demo).
        self.counts: dict[str, float] = {}
        self.listening = asyncio.Event()  # set while the keyspace listener is subscribed

    # ------------------------------------------------------------ plumbing ---

    def _metric(self, name: str, kind: str, value: float, **labels: str) -> None:
        if kind == "counter":
            self.counts[name] = self.counts.get(name, 0) + value
        else:
            self.counts[name] = value
        self.client._hook("lbs_metric", name=name, kind=kind, value=value,
                          labels={"service": self.client.service, "consumer": self.client.id, **labels})

    def start(self) -> None:
        cfg = self.config
        make = asyncio.create_task
        self.tasks.append(make(self._scan_loop(), name=f"lbs-scan-{self.client.id}"))
        self.tasks.append(make(self._deadline_loop(), name=f"lbs-deadlines-{self.client.id}"))
        if cfg.keyspace_recovery:
            self.tasks.append(make(self._keyspace_loop(), name=f"lbs-keyspace-{self.client.id}"))

    async def stop(self) -> None:
        await cancel_and_wait(self.tasks)
        self.tasks = []

    # ------------------------------------------------------------- requeue ---

    async def requeue(self, entry_ids: Iterable[str], path: str, reason: str, *,
                      count_retry: bool = True) -> list[int]:
        """Re-queue every entry whose lock is gone, in one round trip; their result codes.

        ``path`` labels the metrics (``keyspace``, ``deadline``, ``scan``,
        ``startup``, ``claim``, ``heartbeat``). ``count_retry`` is False when
        the holder lives and lost the lock through no fault of the stream.
        """
        ids = list(entry_ids)
        if not ids:
            return []
        c = self.client
        pipe = c._redis.pipeline(transaction=False)
        for entry_id in ids:
            await c._requeue_call(pipe, entry_id, _keys.lock_key(c.service, entry_id), mode="absent", value="",
                                  count_retry=count_retry, reason=reason)
        results = await execute(pipe)
        codes = []
        for entry_id, res in zip(ids, results):
            code, detail = int(res[0]), _text(res[1])
            codes.append(code)
            if code == RequeueCode.REQUEUED:
                self._metric(f"recovery_{path}_requeued_total", "counter", 1)
                self._announce(entry_id, res, detail, path)
            elif code in (RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED):
                self._metric("recovery_dlq_total", "counter", 1, path=path)
                c.log.warning("entry %s out of retries after %s recovery: dead-lettered", entry_id, path)
                c._hook("lbs_stream_dead_lettered", entry_id=entry_id, reason=reason,
                        dead_letter_id=detail if code == RequeueCode.DEAD_LETTERED else "")
            elif code == RequeueCode.REFUSED:
                self._metric("wrong_type_keys_total", "counter", 1)
                c.log.error("cannot re-queue entry %s (%s recovery): %s; it stays pending and is retried",
                            entry_id, path, detail.removeprefix("LBSKEY "))
            elif code == RequeueCode.TRIMMED:
                self._metric("recovery_trimmed_total", "counter", 1, path=path)
                c.log.warning("entry %s was trimmed from the stream before recovery; its pending "
                              "reference was cleaned", entry_id)
            elif detail == "acked":
                self._metric("recovery_duplicate_ack_total", "counter", 1, path=path)
        return codes

    def _announce(self, entry_id: str, res: Any, new_id: str, path: str) -> None:
        """STREAM_EXPIRED, informational: a stream came back into circulation."""
        stream, retry_count = "", 0
        if len(res) >= 4:
            name, _info, _reason = try_decode_input(res[2])
            stream = name or ""
            retry_count = int(res[3])
        self.client.log.info("recovered %s (entry %s -> %s, retry %d)", stream, entry_id, new_id, retry_count)
        self.client._hook("lbs_stream_expired", stream=stream, entry_id=entry_id, new_entry_id=new_id,
                          retry_count=retry_count, path=path)
        self.client._mailbox.put_nowait(Notification(
            NotificationType.STREAM_EXPIRED, stream, entry_id, {}, retry_count, 0,
            f"lock expired; re-queued as {new_id}"))

    # ------------------------------------------------------------ deadlines ---

    async def _deadline_loop(self) -> None:
        every = self.config.deadline_poll_interval
        while True:
            await asyncio.sleep(every)
            try:
                await self.poll_deadlines()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.client.log.debug("deadline poll failed: %s", exc)

    async def poll_deadlines(self, path: str = "deadline") -> int:
        """One poll of the deadline index; returns how many entries it re-queued.

        The one judge of "this consumer is dead": the keyspace listener calls
        it too (``path="keyspace"``) when a lock expires, so a lock that
        lapsed while its holder lives (a stall of the server) is never taken
        from it here; the holder's heartbeat puts it back, without a retry.
        """
        c = self.client
        ttl_ms = self.config.lock_ttl_ms
        # A gap longer than half a TTL (and than a few of our own poll intervals, so a
        # client polling rarely on purpose never mistakes its own pace for a stall).
        stall_ms = max(1000, ttl_ms // 2, int(4000 * self.config.deadline_poll_interval))
        gone = await c._scripts.reap(keys=[c.consumers_key, c.stream_key, self.reaped_key],
                                     args=[c.group, self.lock_prefix, self.config.deadline_batch, stall_ms, ttl_ms])
        codes = await self.requeue([_text(g) for g in gone], path, f"lock expired ({path}: deadline passed)")
        return sum(1 for code in codes if code == RequeueCode.REQUEUED)

    # ------------------------------------------------------------- keyspace ---

    def _channel_pattern(self) -> str:
        db = int(self.client._redis.connection_pool.connection_kwargs.get("db", 0) or 0)
        return f"__keyspace@{db}__:" + _GLOB_SPECIAL.sub(r"\\\1", self.lock_prefix) + "*"

    async def _keyspace_loop(self) -> None:
        """Listen for this service's lock expirations; reconnect on drops and half-open links."""
        c = self.client
        pattern = self._channel_pattern()
        prefix_len = len(pattern) - 1  # the channel minus the trailing '*'
        delay = self.config.read_retry_initial
        ping_every = self.config.pubsub_ping_interval
        first = True
        lost_at: float | None = None
        while True:
            pubsub = c._redis.pubsub()  # on the slot's owner: where the locks expire
            epoch = c._topology_epoch
            try:
                await pubsub.psubscribe(pattern)
                if not first:
                    self._metric("keyspace_listener_reconnects_total", "counter", 1)
                    await c.check_server()  # a restart forgets the keyspace-event setting
                if lost_at is not None:
                    # How long recovery relied on the deadline poller and the scan alone.
                    self._metric("keyspace_listener_gap_seconds", "histogram", time.monotonic() - lost_at)
                    lost_at = None
                first = False
                self.listening.set()
                delay = self.config.read_retry_initial
                last_pong = last_ping = time.monotonic()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(1.0, ping_every))
                    now = time.monotonic()
                    if msg is not None:
                        last_pong = now  # anything arriving proves the link is alive
                        if msg.get("type") == "pmessage" and _text(msg.get("data")) == "expired":
                            await self._on_expired(_text(msg["channel"])[prefix_len:])
                    if now - last_ping >= ping_every:
                        # redis-py's health check only sends; the PONG must come back
                        # on the subscription, or the connection is half-open.
                        await pubsub.ping()
                        last_ping = now
                    if now - last_pong > 2 * ping_every:
                        raise ConnectionError("no PONG on the subscription: the connection is half-open")
                    if c._topology_epoch != epoch:
                        raise ConnectionError(f"the slot moved to {c.node}: resubscribing there")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                if lost_at is None:
                    lost_at = time.monotonic()
                await c._after_failure(exc)
                if c._topology_epoch != epoch:
                    delay = self.config.read_retry_initial  # the new owner is known: go at once
                c.log.warning("keyspace listener lost (%s); resubscribing in %.2fs", exc, delay)
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, self.config.read_retry_max)
            finally:
                self.listening.clear()
                try:
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                except Exception:
                    pass

    async def _on_expired(self, entry_id: str) -> None:
        """A lock expired: poll the deadline index now (it re-queues the entry if its holder is overdue)."""
        c = self.client
        try:
            holder = await c._redis.xpending_range(c.stream_key, c.group, min=entry_id, max=entry_id, count=1)
            if not holder:
                return  # finished or already recovered
            # The holder's deadline is its last heartbeat's; the lock expires no later.
            deadline = await c._redis.zscore(c.consumers_key, holder[0]["consumer"])
            if not await self.poll_deadlines("keyspace"):
                return
        except RedisError as exc:
            c.log.warning("re-queue of %s after its expired event failed: %s", entry_id, exc)
            return
        if deadline is not None:
            # How late Redis announced the expiry, against the lock's deadline.
            self._metric("recovery_expiry_lag_seconds", "histogram", max(0.0, time.time() - deadline / 1000))

    # ----------------------------------------------------------------- scan ---

    async def _scan_loop(self) -> None:
        c = self.client
        interval = c.read_strategy.reconciliation_interval or self.config.reconciliation_interval
        while True:
            try:
                await c.check_server()
                await self.scan()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                c.log.warning("recovery scan failed: %s", exc)
            await asyncio.sleep(random.uniform(0.9 * interval, 1.1 * interval))

    async def scan(self, min_idle: float | None = None) -> dict[str, int]:
        """One full pass over the pending list; returns counts (requeued, alive, pending).

        Pages with an exclusive cursor, so a page of slow-but-alive entries
        never hides dead ones behind it.
        """
        c = self.client
        started = time.perf_counter()
        idle_ms = int((self.config.scan_min_idle if min_idle is None else min_idle) * 1000)
        batch = self.config.scan_batch
        cursor = "-"
        requeued = alive = seen = 0
        while True:
            page = await c._redis.xpending_range(c.stream_key, c.group, min=cursor, max="+", count=batch,
                                                 idle=idle_ms)
            if not page:
                break
            ids = [_text(p["message_id"]) for p in page]
            seen += len(ids)
            pipe = c._redis.pipeline(transaction=False)
            for entry_id in ids:
                pipe.exists(_keys.lock_key(c.service, entry_id))
            exists = await execute(pipe)
            dead = [i for i, e in zip(ids, exists) if not e]
            alive += len(ids) - len(dead)
            if dead:
                codes = await self.requeue(dead, "scan", "lock gone (scan)")
                requeued += sum(1 for code in codes if code == RequeueCode.REQUEUED)
            if len(page) < batch:
                break
            cursor = "(" + ids[-1]
        self._metric("recovery_scan_skipped_alive_total", "counter", alive)
        self._metric("recovery_scan_duration_seconds", "histogram", time.perf_counter() - started)
        depth = (await c._redis.xpending(c.stream_key, c.group))["pending"]
        self._metric("pel_depth", "gauge", depth)
        return {"requeued": requeued, "alive": alive, "pending": seen}

    async def startup(self) -> int:
        """Re-queue this consumer id's own pending entries whose locks are gone (a restart).

        Runs in :meth:`lbs.Client.start` before the reader starts. (Reads
        lock what they deliver in the same script, so a freshly read entry
        never looks dead.)
        """
        c = self.client
        started = time.perf_counter()
        ok = 0.0
        total = 0
        try:
            cursor = "-"
            while True:
                page = await c._redis.xpending_range(c.stream_key, c.group, min=cursor, max="+",
                                                     count=self.config.scan_batch, consumername=c.id)
                if not page:
                    break
                ids = [_text(p["message_id"]) for p in page]
                candidates = [i for i in ids if i not in c._held]
                pipe = c._redis.pipeline(transaction=False)
                for entry_id in candidates:
                    pipe.exists(_keys.lock_key(c.service, entry_id))
                exists = await execute(pipe) if candidates else []
                dead = [i for i, e in zip(candidates, exists) if not e]
                codes = await self.requeue(dead, "startup", "lock gone (startup recovery)")
                total += sum(1 for code in codes if code == RequeueCode.REQUEUED)
                if len(page) < self.config.scan_batch:
                    break
                cursor = "(" + ids[-1]
            ok = 1.0
        finally:
            self._metric("startup_recovery_requeued_total", "counter", total)
            self._metric("startup_recovery_duration_seconds", "histogram", time.perf_counter() - started)
            self._metric("startup_recovery_success", "gauge", ok)
        return total


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
