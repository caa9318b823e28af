"""``run_keyed()``: each held key's messages to a handler in order, committed fenced, let go when drained.

The reader takes keys (LBS entries registered by :class:`lbs.Publisher`)
and hands each to :meth:`KeyedRunner.dispatch`. One sender task batches
every key's next step into one round trip, two round trips in flight on the
link's two keyed connections:

* ``fetch-1.lua`` for newly taken keys: our entry becomes the key's holder
  (a second registration of a key someone else holds is finished unprocessed)
  and the first messages after the committed position come back;
* ``commit-1.lua`` for finished batches: the batch's effects are written and
  the position moves past the batch in one atomic step, fenced by the hold
  (a holder that lost the key, its lease lapsed, writes nothing), and the key's next messages
  come back, or the key is released when drained, or yielded (registered
  again at the back of the LBS) once it has been held for
  ``max_hold_messages`` messages or ``max_hold_seconds``.

A handler that raises (or whose effect cannot be written) hands the key back
with its position, parked for the retry back-off (``Config.retry_delay``;
:mod:`lbs._consumer.delays` promotes it). The failed batch is then taken
apart: the next holds give the handler one message at a time up to its last
message, so the messages before the culprit are committed once, and the
culprit is dead-lettered after 1 + ``Config.max_retries`` failed holds (counted by
``commit-1.lua``, and by ``fetch-1.lua`` for a dead holder; they add up across consumers).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.crc import key_slot
from redis.exceptions import NoScriptError

from _lbscore import CommandBatch, Held, Shape, encode_input, messages_of

from .._redis import scripts
from .._redis.scripts import CommitCode, FetchCode, KeyCommit
from .._redis.wire import text
from ..exceptions import ProtocolError
from ..keyed import Effect, KeyedBatch, KeyedHandler, Message
from ..notifications import Notification
from .activity import Activity
from .backoff import Backoff
from .finisher import Finisher
from .keyhold import KeyHold
from .runner import failure_traceback, handler_coroutine, start_task
from .state import ClientState

__all__ = ["KeyedRunner"]


class KeyedRunner(Activity, kind="keyed"):
    """The keyed handlers of one client's ``run_keyed()`` and the one task that talks to Redis for them."""

    def __init__(
        self,
        state: ClientState,
        finisher: Finisher,
        handler: KeyedHandler,
        soon: Callable[[float], None],
        *,
        batch: int,
        max_hold_messages: int,
        max_hold_seconds: float,
    ) -> None:
        self.state, self.finisher, self.handler = state, finisher, handler
        #: Told how long a failed key is parked for, so the delays task polls by then.
        self.soon = soon
        self.batch, self.max_hold_messages = batch, max_hold_messages
        self.max_hold_seconds = max_hold_seconds
        self._fetch: list[KeyHold] = []
        #: Each key's next step for commit-1.lua.
        self._commit: list[tuple[KeyHold, KeyCommit]] = []
        self._wake = asyncio.Event()
        self._backoff = Backoff(state.config.read_retry_initial, state.config.read_retry_max)
        self._loop = asyncio.get_running_loop()
        self._prefix = state.names.key_prefix
        self._lease_prefix = state.names.lease_prefix
        self._last = f"last:{batch}"
        # On a cluster every effect's stream must hash to the LBS's slot (the script's): fixed per service.
        self._slot = key_slot(state.names.stream_key.encode())

    # -- from the reader and the handlers ------------------------------------

    def dispatch(self, h: Held, note: Notification) -> None:
        """A key was taken: fetch its first messages with the next batch."""
        self._fetch.append(KeyHold(h))
        self._kick()

    def _kick(self) -> None:
        self._wake.set()
        if self.task is None or self.task.done():  # started on demand
            self.start()

    def _step(
        self,
        hold: KeyHold,
        position: str,
        mode: str,
        *,
        reason: str = "",
        trace: str = "",
        effects: Sequence[Effect] = (),
    ) -> None:
        """Queue a key's next commit-1.lua step."""
        h = hold.held
        registers = mode == "yield" or mode.startswith("fail:")
        self._commit.append(
            (
                hold,
                KeyCommit(
                    h.stream,
                    h.entry_id,
                    h.value,
                    position,
                    mode,
                    encode_input(h.stream, {}) if registers else "",
                    reason,
                    trace,
                    effects,
                ),
            )
        )
        self._kick()

    def _start(self, hold: KeyHold, messages: list[Message]) -> None:
        """Hand ``messages`` (XRANGE's reply) of a held key to the handler."""
        s = self.state
        h = hold.held
        if s.holdings.table.get(h.entry_id) is not h:
            return  # disowned meanwhile: the heartbeat let it go
        limit = s.config.max_retries
        if limit >= 0 and hold.fails >= 1 + limit and messages:
            # The holders that had this message died (or were cut off) until its limit: fetch-1.lua counted them.
            reason = (
                f"failed in {hold.fails} holds, the last lost with its holder (died, stalled past the lease "
                "TTL or cut off)"
            )
            s.log.on(h, keyed=True).warning(
                "key %s: message %s %s; dead-lettered", h.stream, messages[0].id, reason
            )
            self._step(hold, "", "skip", reason=reason)
            return
        if not messages:
            self._step(hold, "", self._last)  # nothing to do: let it go (or go on, if one came)
            return
        if hold.isolating:
            messages = messages[:1]
        batch = KeyedBatch(
            h.stream,
            h.token,
            h.entry_id,
            hold.fails + hold.unblamed,
            messages,
            data_stream=self._prefix + "k:" + h.stream,
            slot=self._slot if s.link.node else None,
        )
        hold.batch = batch
        task = start_task(
            self._loop, handler_coroutine(self.handler, batch), f"lbs-keyed-{h.stream}"
        )
        if task.done():
            self._ended(hold, task)
        else:
            h.task = task
            s.handlers.add(task)
            task.add_done_callback(lambda t: self._ended(hold, t))

    def _ended(self, hold: KeyHold, task: asyncio.Task[Any]) -> None:
        s = self.state
        h = hold.held
        h.task = None
        s.handlers.discard(task)
        exc = asyncio.CancelledError() if task.cancelled() else task.exception()
        if s.holdings.table.get(h.entry_id) is not h:
            return  # disowned: the heartbeat let it go
        batch = hold.batch
        assert batch is not None
        if isinstance(exc, asyncio.CancelledError) and s.stopping.is_set():
            # Cut short by close() or a signal: let the key go where it is, no failure counted.
            self._step(hold, "", "yield")
        elif exc is not None:
            s.stats.handler_failures += 1
            s.log.on(h, keyed=True).warning(
                "keyed handler failed on %s at %s (%d message(s)); handing the key back",
                h.stream,
                batch.messages[0].id,
                len(batch.messages),
                exc_info=exc,
            )
            self._failed(hold, batch, f"{type(exc).__name__}: {exc}", failure_traceback(exc))
        else:
            hold.processed += len(batch.messages)
            s.stats.keyed_messages += len(batch.messages)
            over = (
                hold.processed >= self.max_hold_messages
                or time.monotonic() - hold.started >= self.max_hold_seconds
                or s.stopping.is_set()
            )
            if over:
                mode = "yield"
            elif len(batch.messages) >= self.batch or hold.isolating:
                mode = "go"  # more likely follow: read them right behind the commit
            else:
                mode = self._last  # the key looked drained: the commit says if more came
            self._step(hold, batch.messages[-1].id, mode, effects=batch.effects)

    def _failed(self, hold: KeyHold, batch: KeyedBatch, reason: str, trace: str) -> None:
        """The batch failed: hand the key back parked for the retry back-off (``Config.retry_delay``,
        doubling per failure up to ``retry_delay_max``, jittered in [d/2, d]); commit-1.lua counts
        the failure and dead-letters a message that reached the limit instead."""
        cfg = self.state.config
        delay = min(cfg.retry_delay * 2 ** min(hold.fails + hold.unblamed, 40), cfg.retry_delay_max)
        ms = round(delay * random.uniform(0.5, 1.0) * 1000)
        mode = scripts.fail_mode(ms, len(batch.messages) == 1, batch.messages[-1].id, self.batch)
        self._step(hold, "", mode, reason=reason[:1000], trace=trace)

    # -- the sender ----------------------------------------------------------

    async def _main(self) -> None:
        """Send what is queued, a round trip on each of the link's keyed wires at once (two
        connections): Redis works on one batch while the client dispatches the replies of another.
        A key has at most one step queued or in flight, so batches in flight never share a key."""
        inflight: dict[asyncio.Task[None], int] = {}  # round trip -> the keyed wire it uses
        free = list(range(len(self.state.link.keyed)))
        try:
            await self._send(inflight, free)
        finally:
            for t in inflight:  # cancelled (close): the round trips in flight end with it
                t.cancel()
            if inflight:
                await asyncio.wait(inflight)

    async def _send(self, inflight: dict[asyncio.Task[None], int], free: list[int]) -> None:
        while True:
            if (self._fetch or self._commit) and free:
                fetch, self._fetch = self._fetch, []
                commit, self._commit = self._commit, []
                k = free.pop()
                inflight[asyncio.create_task(self._round_trip(k, fetch, commit))] = k
                # Its request goes out; handlers that finish at once queue more.
                await asyncio.sleep(0)
                continue
            if not inflight:
                return
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                done, _ = await asyncio.wait(
                    (*inflight, woken), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                woken.cancel()
            for t in list(inflight):
                if t in done:
                    free.append(inflight.pop(t))

    async def _round_trip(
        self, k: int, fetch: list[KeyHold], commit: list[tuple[KeyHold, KeyCommit]]
    ) -> None:
        """One batch on the link's keyed wire ``k`` (read again on each try: the slot may move).

        Its commits may let their keys go (the LBS entry acked and deleted): until the replies are
        in, a heartbeat that finds the lease lapsed does not count those keys lost but leaves them to
        the replies (``Holdings.settling``)."""
        s = self.state
        ids = [hold.held.entry_id for hold, _ in commit]
        s.holdings.settling.update(ids)
        try:
            await self._attempts(k, fetch, commit)
        finally:
            s.holdings.settling.difference_update(ids)

    async def _attempts(
        self, k: int, fetch: list[KeyHold], commit: list[tuple[KeyHold, KeyCommit]]
    ) -> None:
        s = self.state
        while True:
            wire = s.link.keyed[k]
            try:
                replies = await wire.execute(lambda b: self._build(b, fetch, commit))
            except Exception as exc:
                s.log.warning("keyed batch failed (%s); trying again", exc)
                await self._backoff.sleep(s.stopping)
                if s.stopping.is_set():
                    return  # the keys stay held: close() hands them back
                continue
            self._backoff.reset()
            if any(isinstance(r, NoScriptError) for r in replies):
                # A restart or a failover emptied the script cache: the scripts ran nowhere (and wrote no
                # effect: they are commit-1.lua's).
                s.log.info("Redis lost the scripts (restarted or failed over); loading them again")
                try:
                    await wire.load_scripts()
                except Exception as exc:
                    s.log.warning("loading the scripts failed (%s); trying again", exc)
                    await self._backoff.sleep(s.stopping)
                continue
            self._replies(fetch, commit, replies)
            return

    def _build(
        self, b: CommandBatch, fetch: list[KeyHold], commit: list[tuple[KeyHold, KeyCommit]]
    ) -> None:
        # Each key's messages come from a plain XRANGE behind the script (no Lua in between):
        # every message up to a key's position is trimmed, so "-" starts right after it.
        s = self.state
        n = s.names
        if fetch:
            scripts.fetch(
                b,
                n.stream_key,
                self._prefix,
                self._lease_prefix,
                self.batch,
                n.group,
                [(hold.held.stream, hold.held.entry_id, hold.held.value) for hold in fetch],
            )
            for hold in fetch:
                b.command(
                    "XRANGE", self._prefix + "k:" + hold.held.stream, "-", "+", "COUNT", self.batch
                )
                b.expect(Shape.MESSAGES)
        if commit:
            scripts.commit(
                b,
                n.stream_key,
                self._prefix,
                self._lease_prefix,
                n.group,
                s.server.xackdel,
                n.dead_letter_key,
                s.config.field_prefix,
                s.config.max_retries,
                n.id,
                [step for _, step in commit],
            )
            for hold, step in commit:
                if step.mode in _GOING_ON:
                    b.command(
                        "XRANGE",
                        self._prefix + "k:" + hold.held.stream,
                        "-",
                        "+",
                        "COUNT",
                        self.batch,
                    )
                    b.expect(Shape.MESSAGES)

    def _replies(
        self, fetch: list[KeyHold], commit: list[tuple[KeyHold, KeyCommit]], replies: list[Any]
    ) -> None:
        s = self.state
        at = 0
        if fetch:
            out, reads = replies[at], replies[at + 1 : at + 1 + len(fetch)]
            at += 1 + len(fetch)
            if isinstance(out, Exception):
                s.log.error(
                    "fetching %d keys failed: %s; their entries stay pending to this consumer "
                    "until its lease is gone",
                    len(fetch),
                    out,
                )
                for hold in fetch:
                    s.holdings.drop(hold.held)
            else:
                for hold, reply, messages in zip(fetch, out, reads):
                    self._fetched(hold, reply, messages)
        if commit:
            out = replies[at]
            after = iter(replies[at + 1 :])
            if isinstance(out, Exception):
                s.log.error(
                    "committing %d keys failed: %s; their entries stay pending to this consumer "
                    "until its lease is gone",
                    len(commit),
                    out,
                )
                for hold, _ in commit:
                    s.holdings.drop(hold.held)
            else:
                for (hold, step), reply in zip(commit, out):
                    self._committed(
                        hold, step, reply, next(after) if step.mode in _GOING_ON else None
                    )

    def _fetched(self, hold: KeyHold, reply: list[Any], messages: Any) -> None:
        s = self.state
        code = int(reply[0])
        h = hold.held
        if code == FetchCode.OURS:
            hold.state(reply[3], reply[4], reply[5])
            self._start(hold, _read(s, h.stream, messages))
        elif code == FetchCode.HELD_ELSEWHERE:
            # A second registration of a key another live holder processes: finish it unprocessed.
            if s.holdings.drop(h):
                self.finisher.queue(h)
        else:
            if code == FetchCode.WRONG_TYPE:
                s.log.error(
                    "key %s: %s; leaving its entry %s to recovery",
                    h.stream,
                    text(reply[1]),
                    h.entry_id,
                )
            s.holdings.drop(h)
            s.stats.lock_lost += code == FetchCode.LOST

    def _committed(self, hold: KeyHold, step: KeyCommit, reply: list[Any], messages: Any) -> None:
        s = self.state
        code = int(reply[0])
        h = hold.held
        batch, hold.batch = hold.batch, None
        failing = step.mode.startswith("fail:")
        if failing and code in (CommitCode.MORE, CommitCode.RELEASED):
            # commit-1.lua dead-lettered the message that failed in its last allowed hold (or this
            # call was sent again and the first one had).
            s.stats.dead_lettered += 1
            s.log.warning(
                "key %s: message %s dead-lettered (%s; the limit is 1 + max_retries = %d holds)",
                h.stream,
                batch.messages[0].id if batch else "-",
                step.reason,
                1 + s.config.max_retries,
            )
        if code == CommitCode.MORE:
            hold.state(reply[1], reply[2], reply[3])
            if messages is None:  # "last:<n>" or "fail": the messages that came are in the reply
                try:
                    messages = messages_of(reply[4]) if len(reply) > 4 else []
                except ProtocolError as exc:
                    messages = exc
            self._start(hold, _read(s, h.stream, messages))
            return
        if code == CommitCode.EFFECT_REFUSED and batch is not None:
            # Nothing was written and the key is still ours: the batch failed.
            why = text(reply[1])
            s.stats.handler_failures += 1
            s.log.error(
                "key %s: %s; the batch (%d message(s) from %s) fails",
                h.stream,
                why,
                len(batch.messages),
                batch.messages[0].id,
            )
            hold.batch = batch  # the failure's reply names its message
            self._failed(hold, batch, why, "")
            return
        s.holdings.drop(h)
        if code == CommitCode.RELEASED:
            s.stats.done += 1
            s.count_finished()
        elif code == CommitCode.YIELDED:
            s.stats.handed_back += 1
            if failing:  # parked for the back-off: the delays task brings it back when due
                self.soon(scripts.fail_delay(step.mode))
        else:
            s.stats.lock_lost += 1
            if step.effects:
                s.log.info(
                    "key %s: lost before its commit (its lease lapsed or another holder took it over): "
                    "its %d effect(s) were not written",
                    h.stream,
                    len(step.effects),
                )

    async def flush(self, timeout: float) -> None:
        """Send what is queued (at shutdown, after the handlers ended), for up to ``timeout`` seconds."""
        if self.task is not None and not self.task.done():
            await asyncio.wait((self.task,), timeout=timeout)

    async def stop(self) -> None:
        """Stop the sender, cancelled once so its cleanup runs to its end (what it had queued stays
        pending to this consumer, left to the hand-back at close or to recovery once the lease is
        gone; the link keeps the connections)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait((self.task,))

    close = stop


#: Modes after which a key may go on: its next messages are read behind the commit.
_GOING_ON = ("go", "skip")


def _read(s: ClientState, key: str, messages: Any) -> list[Message]:
    """An XRANGE reply of a key's messages; an error (logged) reads as none: the key is let go or
    goes on at its next commit, and its messages stay."""
    if isinstance(messages, Exception):
        s.log.error("reading the messages of key %s failed: %s", key, messages)
        return []
    return list(messages or ())
