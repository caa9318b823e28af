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
  ``max_hold_messages`` messages or ``max_hold_seconds``; with ``linger`` a drained key
  stays held, running nothing, until a message wakes it (``commit-1.lua`` ``stay:<n>``,
  :mod:`lbs._consumer.linger`), then ``HDEL idle:<token>`` and ``XRANGE`` read its messages.

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

from _lbscore import CommandBatch, Held, Shape, encode_input, messages_of

from .._redis import scripts
from .._redis.scripts import CommitCode, FetchCode, KeyCommit
from .._redis.wire import text
from ..exceptions import ProtocolError
from ..keyed import Effect, KeyedBatch, KeyedHandler, Message
from ..notifications import Notification
from .activity import Activity
from .finisher import Finisher
from .keyedsend import Round, Sender
from .keyhold import KeyHold
from .linger import Lingering
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
        linger: float = 0.0,
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
        self._sender = Sender(state, self._wake, self._take, self._build, self._replies)
        self._loop = asyncio.get_running_loop()
        self._prefix = state.names.key_prefix
        self._lease_prefix = state.names.lease_prefix
        self._last = f"last:{batch}"
        #: Lingering keys (None: ``linger`` 0, a drained key is let go at once).
        self.lingering = (
            Lingering(state, linger, self._resumed, self._linger_end) if linger > 0 else None
        )
        #: After its handler, a key that looks drained stays (lingering) or is let go.
        self._drained = f"stay:{batch}" if self.lingering is not None else self._last
        #: Lingering keys woken: their messages are read in the next round trip.
        self._resume: list[KeyHold] = []
        # On a cluster every effect's stream must hash to the LBS's slot (the script's): fixed per service.
        self._slot = key_slot(state.names.stream_key.encode())

    def running(self) -> list[asyncio.Task[Any] | None]:
        return [self.task, *(self.lingering.tasks if self.lingering is not None else ())]

    # -- from the reader and the handlers ------------------------------------

    def dispatch(self, h: Held, note: Notification) -> None:
        """A key was taken: fetch its first messages with the next batch."""
        self._fetch.append(KeyHold(h))
        if self.lingering is not None:
            self.lingering.start()
        self._kick()

    def _resumed(self, hold: KeyHold) -> None:
        """A lingering key was woken: read its messages with the next batch, or, with every slot
        taken (``concurrency``: lingering keys take none, so those woken may outnumber them), yield
        it to the back of the LBS, where a consumer with a free slot takes it."""
        if self.state.free_slots() < 0:
            self._step(hold, "", "yield")
            return
        hold.resumed()
        self._resume.append(hold)
        self._kick()

    def _linger_end(self, hold: KeyHold) -> None:
        """A key lingered ``linger`` seconds: let it go (the commit hands over what came meanwhile)."""
        self._step(hold, "", self._last)

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
            self._step(hold, "", self._drained)  # nothing to do: linger or let go (or go on)
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
            elif self.lingering is not None and (s.backlog or not self.lingering.worth()):
                # New keys wait (a backlog), or keys do not come back in time: let it go if drained.
                mode = self._last
            else:
                mode = self._drained  # the key looked drained: the commit says if more came
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

    # -- the sender's rounds -------------------------------------------------

    async def _main(self) -> None:
        await self._sender.run()

    def _take(self) -> Round | None:
        """What is queued, as one round (None: nothing)."""
        if not (self._fetch or self._commit or self._resume):
            return None
        rnd = Round(self._fetch, self._commit, self._resume)
        self._fetch, self._commit, self._resume = [], [], []
        return rnd

    def _build(self, b: CommandBatch, rnd: Round) -> None:
        # Each key's messages come from a plain XRANGE behind the script (no Lua in between):
        # every message up to a key's position is trimmed, so "-" starts right after it.
        s = self.state
        n = s.names
        fetch, commit, resume = rnd
        for hold in resume:
            # Running again: a death from now on is counted (fetch-1.lua), then its messages.
            h = hold.held
            b.command("HDEL", self._prefix + "m:" + h.stream, f"idle:{h.token}", "lingers")
            b.command("XRANGE", self._prefix + "k:" + h.stream, "-", "+", "COUNT", self.batch)
            b.expect(Shape.MESSAGES)
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

    def _replies(self, rnd: Round, replies: list[Any]) -> None:
        s = self.state
        fetch, commit, resume = rnd
        at = 2 * len(resume)
        for hold, unidle, messages in zip(resume, replies[0:at:2], replies[1:at:2]):
            if isinstance(unidle, Exception):
                s.log.error("key %s: its state cannot be written (%s)", hold.held.stream, unidle)
            self._start(hold, _read(s, hold.held.stream, messages))
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
            read = _read(s, h.stream, messages)
            if not read and self.lingering is not None and step.mode == self._drained:
                if s.holdings.table.get(h.entry_id) is not h:
                    return
                if self.lingering.closed:  # closing: let it go (drained: released)
                    self._step(hold, "", "yield")
                else:
                    self.lingering.enter(hold, hold.sent_at)
                return
            self._start(hold, read)
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
        """Let go the lingering keys and send what is queued (at shutdown, after the handlers ended),
        for up to ``timeout`` seconds."""
        if self.lingering is not None:
            for hold in self.lingering.close():
                self._step(hold, "", "yield")  # drained: released; else registered again
            await self.lingering.wait_closed()
        if self.task is not None and not self.task.done():
            await asyncio.wait((self.task,), timeout=timeout)

    async def stop(self) -> None:
        """Stop the sender, cancelled once so its cleanup runs to its end (what it had queued stays
        pending to this consumer, left to the hand-back at close or to recovery once the lease is
        gone; the link keeps the connections)."""
        if self.lingering is not None:
            self.lingering.close()
            await self.lingering.wait_closed()
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
