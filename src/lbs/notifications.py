"""What the client tells the application: notifications, and the outcome of ``done_stream``."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Type, TypeVar  # noqa: UP035 (Type: a field is named type)

from .exceptions import InterfaceError, NotHeldError

__all__ = ["DoneStatus", "Notification", "NotificationType"]


class NotificationType(enum.Enum):
    """The kinds of :class:`Notification` (the Go client's names)."""

    #: A data stream was assigned to this consumer; it is held while the consumer's lease lives.
    STREAM_ADDED = "StreamAdded"
    #: A stream's holder lost its lease and recovery put it back in circulation (informational).
    STREAM_EXPIRED = "StreamExpired"
    #: This consumer lost a stream (its lease lapsed: it stalled past the TTL): stop working on it.
    STREAM_DISOWNED = "StreamDisowned"
    #: The reader gave up (read retries exhausted); no more streams will come.
    STREAM_TERMINATED = "StreamTerminated"


@dataclass(frozen=True, slots=True)
class Notification:
    """One event for the application.

    ``token`` is the fencing token of the read that took the stream (one per
    read batch, shared by its entries; it only grows per data stream across
    holders), so downstream systems can refuse writes from a holder that lost
    it. ``reason`` explains STREAM_DISOWNED and STREAM_TERMINATED.

    A STREAM_ADDED notification is also an ``async with`` block over its
    stream: leaving it normally finishes the stream (``done_stream``),
    leaving it with an exception hands the stream back with a retry counted
    (with no retry when the block was cancelled), so a task that dies
    without finishing never leaks the stream::

        async for note in client.notifications():
            if note.type is lbs.NotificationType.STREAM_ADDED:
                async with note:
                    await process(note)
    """

    #: What happened.
    type: NotificationType
    #: The data stream's name.
    stream: str = ""
    #: The assignment's entry id in the LBS.
    entry_id: str = ""
    #: The Info the producer registered the stream with (empty when none).
    info: dict[str, Any] = field(default_factory=dict)
    #: Failed attempts so far (``_retry_count``).
    retry_count: int = 0
    #: The fencing token of the read that took the stream.
    token: int = 0
    #: Why, for STREAM_DISOWNED and STREAM_TERMINATED.
    reason: str = ""
    #: The client that holds the stream (STREAM_ADDED only): what ``async with`` finishes it on.
    holder: Any = field(default=None, repr=False, compare=False)

    async def __aenter__(self) -> Notification:
        if self.holder is None or self.type is not NotificationType.STREAM_ADDED:
            raise InterfaceError(
                f"only a client's STREAM_ADDED notification holds a stream; this is {self.type.name}"
            )
        return self

    async def __aexit__(
        self,
        exc_type: Type[BaseException] | None,  # noqa: UP006 (a field is named type)
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client = self.holder
        try:
            if exc is None:
                await client.done_stream(self.stream, self.entry_id)
            else:
                failed = not isinstance(exc, asyncio.CancelledError)
                await client.hand_back(
                    self.stream,
                    self.entry_id,
                    count_retry=failed,
                    reason=f"raised {exc!r}"[:500] if failed else "cancelled",
                )
        except NotHeldError:
            pass  # finished, handed back or disowned inside the block already


class DoneStatus(enum.Enum):
    """What :meth:`lbs.Client.done_stream` found."""

    #: The stream was ours (pending to us, our lease holding the value it was read under):
    #: the entry acked and deleted, its name released, in one step.
    DONE = "done"
    #: Never reported under the consumer lease (kept for compatibility): once the lease a
    #: stream was read under lapsed, finishing it reads ``LOCK_LOST``.
    LOCK_EXPIRED = "lock_expired"
    #: The lease the stream was read under had lapsed (recovery may have handed it on), or the
    #: entry was no longer pending to us: nothing was acked, and the stream may be processed twice.
    LOCK_LOST = "lock_lost"

    @property
    def lost(self) -> bool:
        """True when the stream was no longer ours at the end."""
        return self is not DoneStatus.DONE


T = TypeVar("T")


class Mailbox(Generic[T]):
    """A bounded single-reader queue that can be closed while writers still write.

    ``put`` waits while the box is full (backpressure on the reader of Redis);
    ``put_nowait`` never waits, for senders that must not stall (the
    heartbeat), whose volume is bounded by the held streams anyway. After
    ``close`` puts are refused (False) and ``get`` returns None once drained.
    """

    def __init__(self, maxsize: int) -> None:
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._closed = False
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()

    def _update(self) -> None:
        if self._items or self._closed:
            self._readable.set()
        else:
            self._readable.clear()
        if self._closed or len(self._items) < self._maxsize:
            self._writable.set()
        else:
            self._writable.clear()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def room(self) -> int:
        """How many more items fit before ``put`` waits."""
        return max(0, self._maxsize - len(self._items))

    async def put(self, item: T) -> bool:
        while not self._closed and len(self._items) >= self._maxsize:
            await self._writable.wait()
        return self.put_nowait(item)

    def put_nowait(self, item: T) -> bool:
        if self._closed:
            return False
        self._items.append(item)
        self._update()
        return True

    async def get(self) -> T | None:
        while not self._items and not self._closed:
            await self._readable.wait()
        if self._items:
            item = self._items.popleft()
            self._update()
            return item
        return None

    def get_nowait(self) -> T | None:
        if not self._items:
            return None
        item = self._items.popleft()
        self._update()
        return item

    def close(self, *, discard: bool = False) -> list[T]:
        """Close; with ``discard``, drop and return what was not yet read."""
        self._closed = True
        dropped: list[T] = []
        if discard:
            dropped = list(self._items)
            self._items.clear()
        self._update()
        return dropped
