"""Finishing streams: ack + delete + release the name, batched into one round trip, retried until answered.

Every concurrent ``done_stream`` (a ``run()`` with many handlers) joins the
next batch: one round trip per batch on the link's ``done`` wire, however
many streams finish at once. On Redis >= 8.4 the batch is a pipeline of plain
commands (``XACKDEL`` and a ``DELEX ... IFEQ`` per name; a name registrations
wait for takes a second, rare round trip to ``release-1.lua``); on 7.x, Valkey
and beside a Go fleet it is one ``done-n.lua`` call (:mod:`lbs._redis.done`).
A done is a commitment: if the connection or
the server fails, the batch is sent again (flagged as a retry, so an entry
a lost call finished reads ALREADY_DONE) with back-off until Redis
answers, while the heartbeat keeps the lease alive (the client stays up until
:meth:`Finisher.drain`). Dropping it instead would leave the entry pending, and
the stream would run twice once recovery took it back.

At steady rates the calls are paced: while what waits is short
(:data:`LINGER_MOST`) and nobody awaits it (``run()``'s handlers finish
without waiting for Redis), a call follows the previous one no sooner than
:data:`LINGER` later, so a stream that finishes alone goes at once but a
steady flow of finishes shares one call per ``LINGER`` instead of paying one
each (a call costs Redis about as much for one entry as for ten). An awaited
finish (``done_stream``), a long queue or a stop goes at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from _lbscore import CommandBatch, Held

from .. import _keys
from .._redis import scripts
from .._redis.connection import topology_error
from .._redis.scripts import DoneCode
from .._redis.wire import UNENCODABLE, first_error, unencodable
from .._waits import wait_set
from ..exceptions import DataError, RedisOperationError
from ..notifications import DoneStatus
from .activity import Activity
from .backoff import Backoff
from .state import ClientState, Names
from .topology import Topology

__all__ = ["Finisher"]

#: Most streams one done-n.lua call finishes.
DONE_BATCH = 1_000
#: Least time between two done-n.lua calls while the queue is short and nobody awaits it (seconds).
LINGER = 0.01
#: A queue this long goes at once, however soon after the last call.
LINGER_MOST = 128
# done-n.lua's codes as the statuses done_stream reports; anything else is a lost stream (LOCK_LOST).
# ALREADY_DONE: a retried call whose first reply was lost found its own work finished.
_DONE_STATUS = {
    int(DoneCode.DONE): DoneStatus.DONE,
    int(DoneCode.ALREADY_DONE): DoneStatus.DONE,
}

#: A stream to finish, and the future that gets its done-n.lua code (None: log the outcome only).
_Item = tuple[Held, "asyncio.Future[Any] | None"]


class Finisher(Activity, kind="finisher"):
    """The finishing task of one client (started on demand); the one caller of ``done-n.lua``."""

    def __init__(self, state: ClientState, topology: Topology) -> None:
        self.state = state
        self.topology = topology
        self._queue: list[_Item] = []
        self._inflight: list[_Item] = []  # the batch Redis runs now
        self._retry: list[_Item] = []  # batches Redis did not answer
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_call = -LINGER  # loop time of the last done-n.lua call

    def queue(self, h: Held, fut: asyncio.Future[Any] | None = None) -> None:
        """Queue ``h`` for the next batch; ``fut`` gets the done code (None: log only)."""
        self._queue.append((h, fut))
        if self.task is None or self.task.done():  # started on demand
            self.start()
        self._idle.clear()
        self._wakeup.set()

    async def finish(self, items: list[Held]) -> list[DoneStatus]:
        """Queue ``items`` and wait for their outcome."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        futures = []
        for h in items:
            fut: asyncio.Future[Any] = loop.create_future()
            self.queue(h, fut)
            futures.append(fut)
        if len(futures) == 1:
            codes = [await futures[0]]
        else:
            # One stream failing alone (it could not be encoded) leaves the others' outcomes counted.
            codes = await asyncio.gather(*futures, return_exceptions=True)
        hooks = self.state.hooks
        released = hooks.listening("lbs_lock_released")
        finished = [
            (h, code) for h, code in zip(items, codes) if not isinstance(code, BaseException)
        ]
        statuses = [self._finished_one(h, code, released) for h, code in finished]
        if statuses and hooks.listening("lbs_locks_released"):
            hooks.notify(
                "lbs_locks_released", released=[(h, st) for (h, _), st in zip(finished, statuses)]
            )
        failed = next((code for code in codes if isinstance(code, BaseException)), None)
        if failed is not None:
            raise failed
        return statuses

    def lease_lost(self) -> None:
        """The lease lapsed while this process lived: what waits to be finished was read under it, and
        may be another consumer's by now, so none of it is sent. What was never sent reads LOCK_LOST
        (nothing was acked; recovery or the heartbeat puts it back). A batch sent whose reply was lost
        (waiting to be sent again) may have run before the lease lapsed, or a re-queue came first: no
        call can tell which now (the entry is gone either way), so its outcome is unknown: its waiter
        gets a :class:`lbs.RedisOperationError` saying so, a handler's stream is logged and reported
        to no hook. A call in flight finishes what is still pending to us (nobody else has it:
        recovery re-queues a copy under a new id), or reads LOCK_LOST where a re-queue came first."""
        sent, unsent = self._retry, self._queue
        self._queue, self._retry = [], []
        self._lose(unsent)
        if not sent:
            return
        s = self.state
        s.log.warning(
            "the lease lapsed while Redis had not answered the done of %d streams: each was finished, "
            "or put back for another consumer (which, no call can tell now): %s",
            len(sent),
            ", ".join(h.stream for h, _ in sent[:10]) + (" ..." if len(sent) > 10 else ""),
        )
        unknown = RedisOperationError(
            "done_stream",
            RedisConnectionError(
                "Redis did not answer and the lease lapsed: the stream was finished, or put back for "
                "another consumer"
            ),
        )
        for _, fut in sent:
            if fut is None:
                s.count_finished()
            elif not fut.done():
                fut.set_exception(unknown)

    def _lose(self, items: list[_Item]) -> None:
        """Each item reads LOCK_LOST (its waiter's result, or a handler's stream reported so)."""
        for h, fut in items:
            if fut is None:
                self._finished_one(h, DoneCode.LOCK_LOST)
            elif not fut.done():
                fut.set_result(int(DoneCode.LOCK_LOST))

    def finishing(self) -> list[Held]:
        """Streams handed to the finisher whose done Redis has not answered yet (the heartbeat extends them)."""
        if not (self._queue or self._inflight or self._retry):
            return []
        return [h for q in (self._queue, self._inflight, self._retry) for h, _ in q]

    async def _main(self) -> None:
        s = self.state
        backoff = Backoff(s.config.read_retry_initial, s.config.read_retry_max)
        while True:
            if not self._queue and not self._retry:
                self._idle.set()
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            if not self._retry and await self._linger():
                continue
            queue, retrying = (self._retry, True) if self._retry else (self._queue, False)
            self._last_call = asyncio.get_running_loop().time()
            batch = self._inflight = queue[:DONE_BATCH]
            del queue[:DONE_BATCH]
            ids = [h.entry_id for h, _ in batch]
            streams = [h.stream for h, _ in batch]
            go = (
                [_keys.go_lock_key(h.stream, h.entry_id) for h, _ in batch]
                if s.config.go_compatible
                else None
            )
            plain = go is None and s.server.plain_done
            if plain and any(_read_under(h) != s.lease.value for h, _ in batch):
                # Read under a lapsed take of the lease (disowned since): lost without a word to Redis
                # (the Lua-free done checks no lease; what such an entry was is put back or taken).
                self._inflight = []
                gone = [item for item in batch if _read_under(item[0]) != s.lease.value]
                queue[:0] = [item for item in batch if _read_under(item[0]) == s.lease.value]
                self._lose(gone)
                continue
            try:
                try:
                    codes = await self._send(ids, streams, retrying, go, plain)
                except RedisConnectionError:
                    # The connection failed with the call in flight: it may have
                    # run. Send it once more on a fresh connection, saying so.
                    retrying = True
                    codes = await self._send(ids, streams, retrying, go, plain)
            except asyncio.CancelledError:
                self._inflight = []
                for _, fut in batch:
                    if fut is not None:
                        fut.cancel()
                raise
            except UNENCODABLE as exc:
                # The core could not encode the call, so nothing was sent: what cannot be encoded alone
                # is set aside and fails alone, the rest goes in the next call at once.
                self._inflight = []
                kept = self._set_aside(batch, go is not None, plain)
                if len(kept) < len(batch):
                    queue[:0] = kept
                    continue
                self._failed(batch, exc)  # each encodes alone (never seen): the call fails whole
                continue
            except Exception as exc:
                self._inflight = []
                s.hooks.metric("done_failures_total", len(batch))
                await self.topology.after_failure(exc)
                if topology_error(exc):  # Redis unreachable, restarting or failing over: try again
                    self._retry[:0] = batch
                    wait = backoff.next()
                    s.log.warning(
                        "finishing %d streams failed (%s); trying again in %.2fs, the lease "
                        "kept alive",
                        len(batch),
                        exc,
                        wait,
                    )
                    await asyncio.sleep(wait)
                    continue
                self._failed(batch, exc, counted=True)
                continue
            self._inflight = []
            backoff.reset()
            released = s.hooks.listening("lbs_lock_released")
            outcomes: list[tuple[Held, DoneStatus]] | None = (
                [] if s.hooks.listening("lbs_locks_released") else None
            )
            for (h, fut), code in zip(batch, codes):
                if code == DoneCode.TAKEN:
                    s.hooks.metric("go_taken_total", 1)
                    s.log.on(h).warning(
                        "%s (entry %s) was taken by a Go consumer while held: not finished here",
                        h.stream,
                        h.entry_id,
                    )
                if fut is None:
                    status = self._finished_one(h, code, released)
                    if outcomes is not None:
                        outcomes.append((h, status))
                elif not fut.done():
                    fut.set_result(code)
            if outcomes:
                s.hooks.notify("lbs_locks_released", released=outcomes)

    def _failed(self, batch: list[_Item], exc: BaseException, counted: bool = False) -> None:
        """A call Redis refused, or that failed otherwise (not "not now"): each of its streams fails (its
        waiter gets the error, or it is logged); they stay pending to this consumer and are handed back at
        close, or recovery brings them back once its lease is gone."""
        s = self.state
        if not counted:
            s.hooks.metric("done_failures_total", len(batch))
        err = RedisOperationError("done_stream", exc) if isinstance(exc, RedisError) else exc
        for h, fut in batch:
            if fut is None:
                s.log.on(h).error("finishing %s failed (%s); it stays pending", h.stream, err)
            elif not fut.done():
                fut.set_exception(err)

    def _set_aside(self, batch: list[_Item], go: bool, plain: bool) -> list[_Item]:
        """The items of a call the core could not encode that it encodes alone, to be sent again; each
        other one fails alone, with the reason (logged, or its waiter gets a :class:`lbs.DataError`):
        it stays pending (the entry judge keeps such names out, so this is a second wall)."""
        s = self.state

        def call(b: CommandBatch, i: int) -> None:
            h = batch[i][0]
            go_keys = [_keys.go_lock_key(h.stream, h.entry_id)] if go else None
            self._writer([h.entry_id], [h.stream], False, go_keys, plain)(b)

        bad = unencodable(len(batch), call)
        for i, why in bad.items():
            h, fut = batch[i]
            s.hooks.metric("done_failures_total", 1)
            if fut is None:
                s.log.on(h).error(
                    "finishing %r (entry %s) failed alone (%s); it stays pending, the others go on",
                    h.stream,
                    h.entry_id,
                    why,
                )
            elif not fut.done():
                fut.set_exception(
                    DataError(
                        f"done_stream({h.stream!r:.200}): entry {h.entry_id} cannot be sent to Redis: "
                        f"{why}"
                    )
                )
        return [item for i, item in enumerate(batch) if i not in bad]

    async def _send(
        self, ids: list[str], streams: list[str], retrying: bool, go: list[str] | None, plain: bool
    ) -> list[int]:
        """Finish one batch in Redis (``retrying``: a call for it may have run already); a code each."""
        s = self.state
        n = s.names
        replies = await s.link.done.execute(self._writer(ids, streams, retrying, go, plain))
        if not plain:
            (reply,) = first_error(replies)
            return scripts.done_codes(reply)
        codes, waited, refused = scripts.plain_codes(replies, _name_keys(n, streams), retrying)
        if refused:
            i, exc = next(iter(refused.items()))
            # Finished all the same; the name's next registration takes it over (its holder is no
            # longer pending), at the cost of a script call.
            s.log.warning(
                "releasing %d names failed (%s: %s, for %r); they are taken over when registered "
                "again",
                len(refused),
                type(exc).__name__,
                exc,
                streams[i],
            )
        if waited:
            # Registrations wait for these names: hand each on to its oldest waiter (the rare path).
            pairs = [(streams[i], ids[i]) for i in waited]
            try:
                first_error(
                    await s.link.done.execute(
                        lambda b: scripts.release(b, n.stream_key, n.key_prefix, pairs)
                    )
                )
            except (RedisError, OSError) as exc:
                # Finished all the same; promote-4.lua's sweep hands the names on within its recheck.
                s.log.warning(
                    "handing on %d names registrations wait for failed (%s); the waiting sweep "
                    "will",
                    len(pairs),
                    exc,
                )
        return codes

    def _writer(
        self, ids: list[str], streams: list[str], retrying: bool, go: list[str] | None, plain: bool
    ) -> Callable[[CommandBatch], None]:
        """What finishes ``ids``: the Lua-free pipeline (``plain``) or one ``done-n.lua`` call."""
        s = self.state
        n = s.names
        if plain:
            keys = _name_keys(n, streams)
            return lambda b: scripts.plain_done(b, n.stream_key, n.group, ids, keys)
        # Under the lease they were read under (lease_lost() fails what was not).
        return _done(n, s.lease.value, ids, streams, s.server.xackdel, retrying, go)

    async def _linger(self) -> bool:
        """Wait (True) when the queue may join the next call: too soon after the last one, short,
        nobody awaiting it, no stop under way (see the module's docstring)."""
        queue = self._queue
        if len(queue) >= LINGER_MOST or self.state.stopping.is_set():
            return False
        left = self._last_call + LINGER - asyncio.get_running_loop().time()
        if left <= 0 or any(fut is not None for _, fut in queue):
            return False
        self._wakeup.clear()
        await wait_set(self._wakeup, left)  # a new finish looks again (awaited? a long queue?)
        return True

    def _finished_one(self, h: Held, code: Any, released: bool = True) -> DoneStatus:
        s = self.state
        status = _DONE_STATUS.get(code, DoneStatus.LOCK_LOST)
        stats = s.stats
        s.count_finished()
        if status is DoneStatus.DONE:
            stats.done += 1
        else:
            stats.lock_lost += 1
        if status.lost:
            s.log.warning(
                "done_stream(%s): %s (entry %s, token %d)",
                h.stream,
                status.value,
                h.entry_id,
                h.token,
            )
        if released:
            s.hooks.notify(
                "lbs_lock_released",
                stream=h.stream,
                entry_id=h.entry_id,
                token=h.token,
                status=status,
            )
        return status

    async def drain(self, timeout: float) -> None:
        """At shutdown: send what is queued (up to ``timeout`` seconds), then stop the task.

        What Redis did not answer by then fails its waiters; those entries stay pending (recovery
        brings them back once the lease is gone).
        """
        if self.task is None or self.task.done() or await wait_set(self._idle, timeout):
            return
        unsent = [*self._queue, *self._retry]
        self.state.log.error(
            "finisher did not drain; %d finished streams stay pending", len(unsent)
        )
        gone = RedisOperationError(
            "done_stream", RedisConnectionError("the client closed before Redis answered")
        )
        for _, fut in unsent:
            if fut is not None and not fut.done():
                fut.set_exception(gone)


def _read_under(h: Held) -> str:
    """The lease value the stream was read under (its held value is ``<token>:<id>:<lease value>``)."""
    return h.value.rpartition(":")[2]


def _name_keys(n: Names, streams: list[str]) -> list[str]:
    """The name holder key of each stream's DataStreamName ("" where names are not held)."""
    prefix = f"{n.key_prefix}name:" if n.key_prefix else ""
    return [f"{prefix}{name}" if prefix and name else "" for name in streams]


def _done(
    n: Names,
    lease: str,
    ids: list[str],
    streams: list[str],
    xackdel: bool,
    retrying: bool,
    go: list[str] | None,
) -> Callable[[CommandBatch], None]:
    """The writer of one ``done-n.lua`` call (``retrying``: it may have run already) for entries read
    under the lease value ``lease``."""

    def build(b: CommandBatch) -> None:
        scripts.done(
            b,
            n.stream_key,
            n.lease_key,
            ids,
            streams,
            n.group,
            n.id,
            lease,
            n.key_prefix,
            xackdel,
            retrying,
            go,
        )

    return build
