"""Notifications to the application: a STREAM_ADDED it takes runs from then on, Redis told first.

Until the application takes a stream's notification, a death of this process
does not count against the stream (it is in the holder's queued set); once
taken it does. :class:`Handover` gives out the mailbox's notifications and
tells Redis (``Heartbeat.mark_running``) before the application gets them,
or, for :meth:`Handover.drain`, which does not wait, at once in the background.
"""

from __future__ import annotations

import asyncio

from _lbscore import Held

from ..notifications import Notification, NotificationType
from .heartbeat import Heartbeat
from .state import ClientState

__all__ = ["Handover"]


class Handover:
    """The notifications of one client on their way to the application."""

    def __init__(self, state: ClientState, heartbeat: Heartbeat) -> None:
        self.state, self.heartbeat = state, heartbeat
        #: drain()'s marks on their way to Redis (cancelled at shutdown: the streams go back).
        self.marking: set[asyncio.Task[None]] = set()

    async def next(self) -> Notification | None:
        """The next notification (waiting for it), handed over; None once closed."""
        return await self.received(await self.state.mailbox.get())

    async def received(self, note: Notification | None) -> Notification | None:
        """``note`` taken from the mailbox: handed over; None (closed) raises what ``run()`` died of."""
        if note is None:
            if self.state.failure is not None:
                raise self.state.failure
        elif started := self.taken([note]):
            await self.heartbeat.mark_running(started)
        return note

    def drain(self, limit: int | None) -> list[Notification]:
        """The notifications already buffered (up to ``limit``), without waiting."""
        mailbox = self.state.mailbox
        out: list[Notification] = []
        while (limit is None or len(out) < limit) and len(mailbox):
            note = mailbox.get_nowait()
            if note is None:
                break
            out.append(note)
        if started := self.taken(out):
            # Not awaited (this call does not wait): Redis is told at once, in the background.
            task = asyncio.create_task(self.heartbeat.mark_running(started))
            self.marking.add(task)
            task.add_done_callback(self.marking.discard)
        return out

    def taken(self, notes: list[Notification]) -> list[Held]:
        """The application took ``notes`` out of the queue: their streams run from now on (a death of
        this process counts against them, as a failed attempt). The records Redis has to be told of."""
        table = self.state.holdings.table
        out = []
        for note in notes:
            if note.type is NotificationType.STREAM_ADDED:
                h = table.get(note.entry_id)
                if h is not None and h.start():
                    out.append(h)
        return out
