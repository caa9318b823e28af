"""Intake: the entries a read took, and their tokens, become held streams.

The reader hands each batch here (a read's, or ``read-3.lua``'s re-read after a
lost reply). Each entry's token says what Redis did with it: an
integer is the batch's fencing token (the entry is pending to us, held by our
lease: a held record, a handler started under ``run()`` or a STREAM_ADDED
notification queued); ``WAIT <entry id>`` (its data stream is held under
another registration) leaves it alone, ``WRONGTYPE`` puts it back. Malformed
entries are dead-lettered.

**Late replies.** A reply read long after it was sent (the process was
frozen, SIGSTOP or a pause, while its blocking read waited in Redis, and
Redis read entries for it meanwhile) may hold entries whose lease lapsed and
which another consumer runs now. Every batch is checked against
the local lease before any handler starts: the heartbeat's
:meth:`~lbs._consumer.heartbeat.Heartbeat.cover` takes it under the lease
from the send time of the write that took it, or refuses it when too little
of the lease is left. A refused batch starts nothing: what is still ours is
handed back, what is not is put back or pardoned, with no retry counted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Container
from typing import Any, Protocol

from redis.exceptions import RedisError

from _lbscore import Entry, Held

from .._redis.wire import text
from ..exceptions import RedisOperationError
from ..notifications import Notification, NotificationType
from .requeue import Requeue
from .state import ClientState

__all__ = ["Dispatch", "Intake"]


class Dispatch(Protocol):
    """Where taken streams go under ``run()`` (:meth:`lbs._consumer.runner.Runner.dispatch`)."""

    def __call__(self, h: Held, note: Notification) -> None: ...


class Intake:
    """Turns one client's read batches into held streams; the late ones it refuses."""

    def __init__(
        self, state: ClientState, requeue: Requeue, cover: Callable[[float], bool]
    ) -> None:
        self.state, self.requeue = state, requeue
        #: The heartbeat's Heartbeat.cover: whether the streams a write sent then took may start.
        self.cover = cover

    async def hand_out(
        self,
        raw_entries: list[Any],
        tokens: list[Any],
        start: str,
        sent: float,
        dispatch: Dispatch | None,
        skipped: Container[str],
    ) -> None:
        """Entries read (``start`` ">" new, "0" a re-read) by a write sent at ``sent`` and their tokens
        become held streams, handed to ``dispatch`` (``run()``'s runner) or, with None, the mailbox;
        the malformed are dead-lettered; those in ``skipped`` (a
        re-read's, already ours) are left alone. A reply read too late (:meth:`Heartbeat.cover`
        refuses it) starts nothing: see :meth:`_refuse`."""
        s = self.state
        # inf: the send time is not known (a test's lost reply); the lease is as fresh as this take.
        late = not self.cover(time.monotonic() if sent == math.inf else sent)
        refused: list[Held] = []
        owner = s.names.lock_owner
        table = s.holdings.table
        bad: list[tuple[Entry, str, str]] = []  # (entry, our held value, reason): to dead-letter
        hooks = s.hooks
        acquired, started = (
            hooks.listening("lbs_lock_acquired"),
            hooks.listening("lbs_stream_started"),
        )
        batch: list[Notification] | None = [] if hooks.listening("lbs_streams_started") else None
        stats, holder = s.stats, s.owner
        # The journal's "retaken": a re-queued copy taken.
        retaken = s.journal.retaken if s.journal.on else None
        taken_at = time.monotonic()
        queued = dispatch is None and start == ">"  # a re-read ("0") adds nothing to the queued set
        waiting = 0
        garbage: list[str] = []  # entries whose name's keys are of another type: put back, parked
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
                    # Its name's holder key (or waiting list) is garbage of another type: the entry
                    # cannot be held by name. It goes back, parked for a retry delay (no retry
                    # counted), and is read again then: it runs once the key is removed.
                    kind, _, key = tok[10:].partition(" ")
                    s.hooks.metric("wrong_type_keys_total", 1)
                    s.log.error(
                        "entry %s: %s holds a value of the wrong type (%s); the entry goes back and "
                        "is tried again after %gs, until the key is removed",
                        e.id,
                        key,
                        kind,
                        self.parked_for,
                    )
                    garbage.append(e.id)
                continue
            if e.id in table or e.id in skipped:
                continue  # re-read: already ours, or being finished or handed back
            if e.error is not None:
                bad.append((e, f"{tok}:{owner}", str(e.error)))
                continue
            retry_count = e.retry_count
            # Queued for the application (no run()): the read put it in our queued set until it is taken.
            h = s.holdings.take(e, tok, retry_count, taken_at, queued)
            if late:
                s.holdings.drop(h)
                refused.append(h)
                continue
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
        s.holdings.batches_seen({t for t in tokens if isinstance(t, int)})
        if waiting:
            hooks.metric("streams_waiting_total", waiting)
        if batch:
            hooks.notify("lbs_streams_started", notifications=batch)
        if bad:
            await self.requeue.malformed.dead_letter(bad)
        if garbage:
            await self._park(garbage)
        if refused:
            await self._refuse(refused, time.monotonic() - sent)

    @property
    def parked_for(self) -> float:
        """How long an entry whose name's keys are of another type is parked before it is read again."""
        return max(self.state.config.retry_delay, 1.0)

    async def _park(self, entry_ids: list[str]) -> None:
        """Put back entries this consumer cannot hold by name (a key of another type), parked for
        :attr:`parked_for`, no retry counted; a failure leaves them pending (handed back at close)."""
        s = self.state
        calls = [(i, "name key of the wrong type") for i in entry_ids]
        try:
            await self.requeue.send(calls, mode="owned", count_retry=False, delay=self.parked_for)
        except (RedisError, OSError) as exc:
            s.log.error(
                "putting back %d entries failed (%s); they stay pending", len(entry_ids), exc
            )

    async def _refuse(self, refused: list[Held], age: float) -> None:
        """Streams whose reply was read ``age`` seconds after its write was sent, too late to start them:
        the lease they were read under may have lapsed and another consumer may run them now. Handed
        back where they are still ours, put back (or pardoned, when another consumer took them) where
        they are not; no retry counted either way. A failure leaves them pending to this consumer,
        to recovery once its lease is gone."""
        s = self.state
        s.hooks.metric("late_replies_total", len(refused))
        s.log.warning(
            "a read's reply came %.2fs after it was sent (this process was frozen or starved?), too late "
            "to run its %d streams safely (the lease may have lapsed and another consumer taken them): handing "
            "them back, no retry counted",
            age,
            len(refused),
        )
        reason = f"{s.names.id} read the reply {age:.2f}s late; not started"
        try:
            ids = await self.requeue.hand_back(refused, count_retry=False, reason=reason)
            lost = [h.entry_id for h, new_id in zip(refused, ids) if not new_id]
            if lost:
                await self.requeue.lost_while_alive(lost, reason)
        except (RedisError, OSError, RedisOperationError) as exc:
            s.log.error(
                "handing back %d streams read too late failed (%s); they stay pending to this consumer "
                "until its lease is gone",
                len(refused),
                exc,
            )

    @staticmethod
    def _own_token(tok: Any, owner: str) -> int | str:
        """The token as an int when it is one, or a held value ``"<token>:<our id>:<our instance>"``
        of this very process's; else the reply as text (``WAIT ...``, ``WRONGTYPE ...``).

        A read and ``read-3.lua`` give integer tokens for what they deliver (a re-read too:
        the token its lost read recorded); the held-value form is what a take answered under the lock
        per entry, and is still accepted.
        """
        if isinstance(tok, int):
            return tok
        value = text(tok, "replace")
        token, _, holder = value.partition(":")
        if holder == owner and token.isdigit():
            return int(token)
        return value
