"""The journal's writer: what happened in this consumer, appended to ``{<service>-input}:events``.

The activities call :meth:`Journal.record` (through its helpers) on rare paths
only: a handler failed, a stream was dead-lettered, recovered, re-taken as a
re-queued copy, disowned; the client started or stopped. A record is a list
append into a bounded buffer: it never awaits and never raises. Counts come
from what the client keeps anyway (``ClientState.stats``, the metric
counters): every ``Config.journal_interval`` the task adds their deltas as a
``tally``, only when one is not zero, so an idle fleet writes nothing and the
hot path does no new work per assignment.

Once a second, when something was recorded, the task writes the buffer in one
round trip: ``XADD <key> MAXLEN ~ <Config.journal_maxlen> * kind .. consumer ..
...`` per event, on a wire of its own (a pool connection per batch, so a slow
journal holds up no other batch). Nothing about it may break or slow the
consumer: a failed batch (a dropped connection, a LOADING or moved server, a
key of the wrong type, an ACL denial, no reply within :data:`FLUSH_TIMEOUT`)
is dropped and counted in the next tally's ``dropped``, and logged at most once
a minute. Bounds: :data:`BUFFER` events wait at most (the rest are dropped and
counted), and at most :data:`FAILED_PER_FLUSH` ``failed`` events per batch (the
rest are counted in the tally's ``failed`` only, and ``unlisted``), so a poison
storm cannot flood Redis. ``close()`` adds the last tally and ``stopped`` and
flushes once more, waiting at most :data:`CLOSE_WAIT`. The format and its
reader are :mod:`lbs.events`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from _lbscore import CommandBatch

from .. import _keys
from .._redis.errors import WrongTypeError
from .._redis.wire import Wire, sendable
from .._waits import within
from .activity import Activity

if TYPE_CHECKING:
    from _lbscore import Held

    from .state import ClientState, Link

__all__ = ["Holders", "Journal"]

#: Events waiting for the next flush at most (more are dropped and counted).
BUFFER = 1000
#: ``failed`` events per flush at most (more are counted in the tally only).
FAILED_PER_FLUSH = 100
#: Seconds between two flushes while something is recorded.
FLUSH_EVERY = 1.0
#: Longest wait for one flush's replies (seconds); then the batch counts as dropped.
FLUSH_TIMEOUT = 5.0
#: Longest wait for the last flush on ``close()`` (seconds).
CLOSE_WAIT = 2.0
#: The fields of ``started`` and ``tally`` events lbs writes itself (``lbs_process_info`` cannot).
_OWN = frozenset(("kind", "consumer", "pid", "host", "version"))
TALLY_FIELDS = frozenset(
    ("done", "failed", "dead_lettered", "recovered", "keyed", "unlisted", "dropped", "interval_ms")
)
#: A failure to write is logged at most once in this many seconds.
LOG_EVERY = 60.0
#: The most of a traceback an event keeps (its end: the innermost frames and the error).
TRACEBACK_CHARS = 8192
#: The metric counters whose sum is the tally's ``recovered``.
RECOVERED_METRICS = tuple(
    f"recovery_{path}_requeued_total"
    for path in ("keyspace", "deadline", "scan", "startup", "claim", "heartbeat")
)
#: Paths on which the holder of a recovered stream is this consumer.
OWN_PATHS = ("heartbeat", "startup")

#: A recovered entry's holder and its deadline (server ms, "" when unknown), by entry id.
Holders = Mapping[str, tuple[str, str]]


class Journal(Activity, kind="journal"):
    """One client's journal writer (no task and no record with ``Config.journal=False``)."""

    def __init__(self, state: ClientState) -> None:
        self.state = state
        cfg = state.config
        #: Whether anything is recorded and written.
        self.on = cfg.journal
        self.key = _keys.events_stream(state.names.service)
        self._maxlen = str(cfg.journal_maxlen)
        self._buffer: list[tuple[str, dict[str, Any]]] = []
        self._failed = 0  # failed events in the buffer
        self._unlisted = 0  # failed events left out (FAILED_PER_FLUSH)
        self._dropped = 0  # events lost: buffer full, or their batch failed
        self._counts = self._totals()
        self._tally_at = time.monotonic()
        self._wire: Wire | None = None
        self._link: Link | None = None
        self._logged_at = -LOG_EVERY
        self._started = False
        #: What plugins said of this process (``lbs_process_info``), on ``started`` and every tally.
        self._info: dict[str, str] = {}

    # --------------------------------------------------------------- record ---

    def record(self, kind: str, **fields: Any) -> None:
        """Buffer one event (values made text at the flush); never awaits, never raises."""
        if not self.on:
            return
        if kind == "failed":
            if self._failed >= FAILED_PER_FLUSH:
                self._unlisted += 1
                return
            self._failed += 1
        if len(self._buffer) >= BUFFER:
            self._dropped += 1
            return
        self._buffer.append((kind, fields))

    def failed(self, h: Held, reason: str, trace: str) -> None:
        """A ``run()`` handler raised or timed out on ``h``."""
        if self.on:
            self.record(
                "failed",
                stream=h.stream,
                entry_id=h.entry_id,
                token=h.token,
                retry_count=h.retry_count,
                reason=reason,
                traceback=trace[-TRACEBACK_CHARS:],
            )

    def retaken(self, h: Held, original_id: str) -> None:
        """This consumer took a re-queued copy (a retry, or a dead holder's stream) as ``h``."""
        self.record(
            "retaken",
            stream=h.stream,
            entry_id=h.entry_id,
            original_id=original_id,
            retry_count=h.retry_count,
            token=h.token,
        )

    def dead_lettered(self, stream: str | None, entry_id: str, reason: str, letter: str) -> None:
        self.record(
            "dead_lettered",
            stream=stream or "",
            entry_id=entry_id,
            reason=reason,
            dead_letter_id=letter,
        )

    def recovered(
        self,
        stream: str,
        entry_id: str,
        new_id: str,
        retry_count: int,
        path: str,
        holders: object = None,
    ) -> None:
        """Recovery put ``entry_id`` back as ``new_id``; ``holders``, when a :data:`Holders`: who held it."""
        if not self.on:
            return
        holder, deadline = ("", "")
        if isinstance(holders, Mapping):
            holder, deadline = holders.get(entry_id, ("", ""))
        if not holder and path in OWN_PATHS:
            holder = self.state.names.id
        self.record(
            "recovered",
            holder=holder,
            stream=stream,
            entry_id=entry_id,
            new_entry_id=new_id,
            retry_count=retry_count,
            path=path,
            deadline_ms=deadline,
        )

    # ---------------------------------------------------------------- task ---

    def start(self) -> None:
        if not self.on:
            return
        from .. import __version__  # here: lbs is imported by now

        self._started = True
        info = self.state.hooks.process_info().items()
        self._info = {k: v for k, v in info if k not in _OWN and k not in TALLY_FIELDS}
        self.record("started", **self._info, **self._process(), version=__version__)
        super().start()

    async def _main(self) -> None:
        every = self.state.config.journal_interval
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            if time.monotonic() - self._tally_at >= every:
                self.tally()
            if self._buffer:
                await self.flush()

    async def close(self, handed_back: int) -> None:
        """The last tally, ``stopped``, and one more flush (at most :data:`CLOSE_WAIT`)."""
        await self.stop()
        if not self._started:
            return
        self._started = False
        from .. import __version__

        self.tally()
        self.record("stopped", **self._process(), version=__version__, handed_back=handed_back)
        try:
            await within(self.flush(), CLOSE_WAIT)
        except asyncio.TimeoutError:
            pass  # counted in dropped by the flush

    def _process(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname()}

    def _totals(self) -> tuple[int, ...]:
        st, counts = self.state.stats, self.state.hooks.counts
        return (
            st.finished,
            st.handler_failures + st.handler_timeouts,
            st.dead_lettered,
            int(sum(counts.get(m, 0) for m in RECOVERED_METRICS)),
            st.keyed_messages,
        )

    def tally(self) -> None:
        """Add the counts since the last tally, when one is not zero."""
        if not self.on:
            return
        now = time.monotonic()
        totals = self._totals()
        done, failed, dead, recovered, keyed = (a - b for a, b in zip(totals, self._counts))
        if not (done or failed or dead or recovered or keyed or self._dropped):
            return
        self._counts, interval = totals, now - self._tally_at
        self._tally_at = now
        unlisted, dropped, self._unlisted, self._dropped = self._unlisted, self._dropped, 0, 0
        self._buffer.append(
            (
                "tally",
                {
                    "done": done,
                    "failed": failed,
                    "dead_lettered": dead,
                    "recovered": recovered,
                    "keyed": keyed,
                    "unlisted": unlisted,
                    "dropped": dropped,
                    "interval_ms": round(interval * 1000),
                    **self._info,  # a busy journal trims `started`: the metrics URL stays findable
                },
            )
        )

    async def flush(self) -> int:
        """Write the buffer in one round trip; how many events were written (the rest counted dropped)."""
        events, self._buffer, self._failed = self._buffer, [], 0
        if not events:
            return 0
        s = self.state
        key, maxlen, consumer = self.key, self._maxlen, s.names.id

        def build(b: CommandBatch) -> None:
            for kind, fields in events:
                args = ["XADD", key, "MAXLEN", "~", maxlen, "*", "kind", kind, "consumer", consumer]
                for name, value in fields.items():
                    # sendable: a handler's error text with a lone surrogate fails no flush.
                    args += (name, sendable(str(value)))
                b.command(*args)

        if self._link is not s.link or self._wire is None:
            self._link, self._wire = s.link, Wire(s.link.redis, hold=False)
        try:
            replies = await within(self._wire.execute(build), FLUSH_TIMEOUT)
        except asyncio.CancelledError:
            self._dropped += len(events)
            raise
        except Exception as exc:
            self._dropped += len(events)
            self._failure(exc)
            return 0
        errors = [r for r in replies if isinstance(r, Exception)]
        if errors:
            self._dropped += len(errors)
            self._failure(errors[0])
        return len(events) - len(errors)

    def _failure(self, exc: BaseException) -> None:
        """Log a failed write: a denial once per rule, anything else at most once a minute."""
        s = self.state
        if s.denied(exc, f"writing the journal {self.key}"):
            return
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY:
            return
        self._logged_at = now
        if isinstance(exc, WrongTypeError):
            s.log.warning(
                "the journal %s holds a value of another type, not a stream: its events are dropped "
                "(delete or rename the key; logged again in %.0fs at most)",
                self.key,
                LOG_EVERY,
            )
        else:
            s.log.warning(
                "writing the journal %s failed (%s: %s); those events are dropped, counted in the "
                "next tally (logged again in %.0fs at most)",
                self.key,
                type(exc).__name__,
                exc,
                LOG_EVERY,
            )
