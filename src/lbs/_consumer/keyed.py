"""``run_keyed()``: each held key's messages to a handler in order, committed fenced, let go when drained.

The reader takes keys (LBS entries registered by :class:`lbs.Publisher`)
and hands each to :meth:`KeyedRunner.dispatch`. One sender task batches
every key's next step into one round trip, two round trips in flight on the
link's two keyed connections:

* ``fetch-1.lua`` for newly taken keys: our entry becomes the key's holder
  (a second registration of a key someone else holds is finished unprocessed)
  and the first messages after the committed position come back;
* the effects of finished batches (``XADD ... IDMP``, Redis >= 8.6), then
  ``commit-1.lua``: the position moves past the batch (fenced by the lock),
  and the key's next messages come back, or the key is released when
  drained, or yielded (registered again at the back of the LBS) once it has
  been held for ``max_hold_messages`` messages or ``max_hold_seconds``.

A handler that raises hands the key back with its position, parked for
the retry back-off (``Config.retry_delay``, doubling up to
``retry_delay_max``; the parking stream that :mod:`lbs._consumer.delays`
promotes); the next hold counts a retry and gets one message at a time; a
message that has failed in more than ``Config.max_retries`` holds, one of
them at least alone, goes to the dead-letter stream (``commit-1.lua``'s
``skip``) and the key goes on after it: a failed batch never dead-letters a
message that was not tried by itself.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from redis.exceptions import NoScriptError

from _lbscore import CommandBatch, Held, Shape, encode_input, messages_of

from .._redis import scripts
from .._redis.scripts import CommitCode, FetchCode
from .._redis.wire import text
from ..exceptions import ProtocolError
from ..keyed import KeyedBatch, KeyedHandler, Message
from ..notifications import Notification
from .backoff import Backoff
from .finisher import Finisher
from .runner import handler_coroutine, start_task
from .state import ConsumerState

__all__ = ["KeyedRunner"]


class _Hold:
    """One held key: when the hold started, messages processed in it, its last batch."""

    __slots__ = ("held", "started", "processed", "batch", "retry_count")

    def __init__(self, held: Held) -> None:
        self.held = held
        self.started = time.monotonic()
        self.processed = 0
        self.batch: KeyedBatch | None = None
        self.retry_count = 0


class KeyedRunner:
    """The keyed handlers of one client's ``run_keyed()`` and the one task that talks to Redis for them."""

    def __init__(self, state: ConsumerState, finisher: Finisher, handler: KeyedHandler, *, batch: int,
                 max_hold_messages: int, max_hold_seconds: float) -> None:
        self.state, self.finisher, self.handler = state, finisher, handler
        self.batch, self.max_hold_messages, self.max_hold_seconds = batch, max_hold_messages, max_hold_seconds
        self._fetch: list[_Hold] = []
        #: (hold, position, mode, reason)
        self._commit: list[tuple[_Hold, str, str, str]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._backoff = Backoff(state.config.read_retry_initial, state.config.read_retry_max)
        self._loop = asyncio.get_running_loop()
        self._prefix = state.names.key_prefix
        self._lock_prefix = state.names.lock_key_prefix
        self._last = f"last:{batch}"

    # -- from the reader and the handlers ------------------------------------

    def dispatch(self, h: Held, note: Notification) -> None:
        """A key was taken: fetch its first messages with the next batch."""
        self._fetch.append(_Hold(h))
        self._kick()

    def _kick(self) -> None:
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._send_loop(), name=f"lbs-keyed-{self.state.names.id}")

    def _start(self, hold: _Hold, messages: list[Message]) -> None:
        """Hand ``messages`` (XRANGE's reply) of a held key to the handler."""
        s = self.state
        h = hold.held
        if s.holdings.table.get(h.entry_id) is not h:
            return  # disowned meanwhile: the heartbeat let it go
        if hold.retry_count > max(1, s.config.max_retries):  # (hold 1 may have failed a whole batch)
            reason = f"failed in {hold.retry_count} holds; consumer {s.names.id}"
            self._commit.append((hold, "", "skip", reason))
            s.stats.dead_lettered += 1
            hold.retry_count = 0
            self._kick()
            return
        if not messages:
            self._commit.append((hold, "", self._last, ""))  # nothing to do: let it go (or go on, if one came)
            self._kick()
            return
        if hold.retry_count:
            messages = messages[:1]
        batch = KeyedBatch(h.stream, h.token, h.entry_id, hold.retry_count, messages,
                           data_stream=self._prefix + "k:" + h.stream)
        hold.batch = batch
        task = start_task(self._loop, handler_coroutine(self.handler, batch), f"lbs-keyed-{h.stream}")
        if task.done():
            self._ended(hold, task)
        else:
            h.task = task
            s.handlers.add(task)
            task.add_done_callback(lambda t: self._ended(hold, t))

    def _ended(self, hold: _Hold, task: asyncio.Task[Any]) -> None:
        s = self.state
        h = hold.held
        h.task = None
        s.handlers.discard(task)
        exc = asyncio.CancelledError() if task.cancelled() else task.exception()
        if s.holdings.table.get(h.entry_id) is not h or (exc is not None and s.stopping.is_set()):
            return  # disowned, or stopping: close() hands it back
        batch = hold.batch
        assert batch is not None
        if exc is not None:
            s.stats.handler_failures += 1
            s.log.warning("keyed handler failed on %s at %s: %r; handing the key back", h.stream,
                          batch.messages[0].id if batch.messages else "-", exc)
            batch.effects.clear()
            self._commit.append((hold, "", self._retry_mode(hold.retry_count), ""))
        else:
            hold.processed += len(batch.messages)
            s.stats.keyed_messages += len(batch.messages)
            over = (hold.processed >= self.max_hold_messages
                    or time.monotonic() - hold.started >= self.max_hold_seconds or s.stopping.is_set())
            if over:
                mode = "yield"
            elif len(batch.messages) >= self.batch or hold.retry_count:
                mode = "go"  # more likely follow: read them right behind the commit
            else:
                mode = self._last  # the key looked drained: the commit says if more came
            self._commit.append((hold, batch.messages[-1].id if batch.messages else "", mode, ""))
        self._kick()

    def _retry_mode(self, retry_count: int) -> str:
        """commit-1.lua's mode for a failed batch: parked for the retry back-off (``Config.retry_delay``,
        doubling per retry up to ``retry_delay_max``, jittered in [d/2, d]), or "yield" (no delay)."""
        cfg = self.state.config
        delay = min(cfg.retry_delay * 2 ** retry_count, cfg.retry_delay_max) * random.uniform(0.5, 1.0)
        ms = round(delay * 1000)
        return f"retry:{ms}" if ms > 0 else "yield"

    # -- the sender ----------------------------------------------------------

    async def _send_loop(self) -> None:
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
                await asyncio.sleep(0)  # its request goes out; handlers that finish at once queue more
                continue
            if not inflight:
                return
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                done, _ = await asyncio.wait((*inflight, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
            for t in list(inflight):
                if t in done:
                    free.append(inflight.pop(t))

    async def _round_trip(self, k: int, fetch: list[_Hold], commit: list[tuple[_Hold, str, str, str]]) -> None:
        """One batch on the link's keyed wire ``k`` (read again on each try: the slot may move)."""
        s = self.state
        while True:
            wire = s.link.keyed[k]
            try:
                replies = await wire.execute(lambda b: self._build(b, fetch, commit))
            except Exception as exc:
                s.log.warning("keyed batch failed (%s); trying again", exc)
                await self._backoff.sleep(s.stopping)
                if s.stopping.is_set():
                    return  # the locks expire; recovery brings the keys back
                continue
            self._backoff.reset()
            if any(isinstance(r, NoScriptError) for r in replies):
                # A restart or a failover emptied the script cache: the scripts ran nowhere (effects,
                # if any, were written: IDMP makes the second write a no-op on Redis >= 8.6).
                s.log.info("Redis lost the scripts (restarted or failed over); loading them again")
                try:
                    await wire.load_scripts()
                except Exception as exc:
                    s.log.warning("loading the scripts failed (%s); trying again", exc)
                    await self._backoff.sleep(s.stopping)
                continue
            self._replies(fetch, commit, replies)
            return

    def _build(self, b: CommandBatch, fetch: list[_Hold], commit: list[tuple[_Hold, str, str, str]]) -> None:
        # Each key's messages come from a plain XRANGE behind the script (no Lua in between):
        # every message up to a key's position is trimmed, so "-" starts right after it.
        s = self.state
        n = s.names
        idmp = s.server.version >= (8, 6)
        for hold, _, _, _ in commit:
            batch = hold.batch
            for e in (batch.effects if batch is not None else ()):
                if idmp:
                    b.command("XADD", e.stream, "IDMP", e.producer, e.iid, "*", *e.fields)
                else:
                    b.command("XADD", e.stream, "*", *e.fields)
        if fetch:
            scripts.fetch(b, n.stream_key, self._prefix, self._lock_prefix,
                          [(hold.held.stream, hold.held.entry_id, hold.held.value) for hold in fetch])
            for hold in fetch:
                b.command("XRANGE", self._prefix + "k:" + hold.held.stream, "-", "+", "COUNT", self.batch)
                b.expect(Shape.MESSAGES)
        if commit:
            scripts.commit(b, n.stream_key, self._prefix, self._lock_prefix, n.group, s.server.xackdel,
                           n.dead_letter_key, s.config.field_prefix,
                           [(hold.held.stream, hold.held.entry_id, hold.held.value, pos, mode,
                             encode_input(hold.held.stream, {}) if _registers(mode) else "", reason)
                            for hold, pos, mode, reason in commit])
            for hold, _, mode, _ in commit:
                if mode in _GOING_ON:
                    b.command("XRANGE", self._prefix + "k:" + hold.held.stream, "-", "+", "COUNT", self.batch)
                    b.expect(Shape.MESSAGES)

    def _replies(self, fetch: list[_Hold], commit: list[tuple[_Hold, str, str, str]], replies: list[Any]) -> None:
        s = self.state
        effects = sum(len(hold.batch.effects) for hold, *_ in commit if hold.batch is not None)
        for r in replies[:effects]:
            if isinstance(r, Exception):
                s.log.error("writing a keyed handler's effect failed: %s", r)
        at = effects
        if fetch:
            out, reads = replies[at], replies[at + 1:at + 1 + len(fetch)]
            at += 1 + len(fetch)
            if isinstance(out, Exception):
                s.log.error("fetching %d keys failed: %s; their locks will expire", len(fetch), out)
                for hold in fetch:
                    s.holdings.drop(hold.held)
            else:
                for hold, reply, messages in zip(fetch, out, reads):
                    self._fetched(hold, reply, messages)
        if commit:
            out = replies[at]
            after = iter(replies[at + 1:])
            if isinstance(out, Exception):
                s.log.error("committing %d keys failed: %s; their locks will expire", len(commit), out)
                for hold, *_ in commit:
                    s.holdings.drop(hold.held)
            else:
                for (hold, _, mode, _), reply in zip(commit, out):
                    self._committed(hold, reply, next(after) if mode in _GOING_ON else None)

    def _fetched(self, hold: _Hold, reply: list[Any], messages: Any) -> None:
        s = self.state
        code = int(reply[0])
        h = hold.held
        if code == FetchCode.OURS:
            hold.retry_count = max(0, int(reply[1]) - 1)
            self._start(hold, _read(s, h.stream, messages))
        elif code == FetchCode.HELD_ELSEWHERE:
            # A second registration of a key another live holder processes: finish it unprocessed.
            if s.holdings.drop(h):
                self.finisher.queue(h)
        else:
            if code == FetchCode.WRONG_TYPE:
                s.log.error("key %s: %s; leaving its entry %s to recovery", h.stream, text(reply[1]), h.entry_id)
            s.holdings.drop(h)
            s.stats.lock_lost += code == FetchCode.LOST

    def _committed(self, hold: _Hold, reply: list[Any], messages: Any) -> None:
        s = self.state
        code = int(reply[0])
        h = hold.held
        hold.batch = None
        if code == CommitCode.MORE:
            hold.retry_count = 0
            if messages is None:  # "last:<n>": the messages that came are in the reply
                try:
                    messages = messages_of(reply[1])
                except ProtocolError as exc:
                    messages = exc
            self._start(hold, _read(s, h.stream, messages))
            return
        s.holdings.drop(h)
        if code == CommitCode.RELEASED:
            s.stats.done += 1
            s.count_finished()
        elif code == CommitCode.YIELDED:
            s.stats.handed_back += 1
        else:
            s.stats.lock_lost += 1

    async def flush(self, timeout: float) -> None:
        """Send what is queued (at shutdown, after the handlers ended), for up to ``timeout`` seconds."""
        if self._task is not None and not self._task.done():
            await asyncio.wait((self._task,), timeout=timeout)

    async def close(self) -> None:
        """Stop the sender (what it had queued is left to the locks' expiry; the link keeps the connections)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait((self._task,))


#: Modes after which a key may go on: its next messages are read behind the commit.
_GOING_ON = ("go", "skip")


def _registers(mode: str) -> bool:
    """Whether commit-1.lua registers the key again in this mode ("yield", "retry:<ms>")."""
    return mode == "yield" or mode.startswith("retry:")


def _read(s: ConsumerState, key: str, messages: Any) -> list[Message]:
    """An XRANGE reply of a key's messages; an error (logged) reads as none: the key is let go or
    goes on at its next commit, and its messages stay."""
    if isinstance(messages, Exception):
        s.log.error("reading the messages of key %s failed: %s", key, messages)
        return []
    return list(messages or ())


