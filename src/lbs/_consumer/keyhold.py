"""One key held under ``run_keyed()``: its hold's figures and where a failure is being isolated."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .._redis.wire import text

if TYPE_CHECKING:
    from _lbscore import Held

    from ..keyed import KeyedBatch

__all__ = ["KeyHold"]


class KeyHold:
    """One held key: when the hold started, messages processed in it, its last batch, and where a
    failure is being isolated (from the key's state: ``fetch-1.lua`` and ``commit-1.lua`` replies)."""

    __slots__ = (
        "batch",
        "fails",
        "held",
        "lingering",
        "processed",
        "sent_at",
        "started",
        "unblamed",
        "until",
    )

    def __init__(self, held: Held) -> None:
        self.held = held
        self.started = time.monotonic()
        self.processed = 0
        self.batch: KeyedBatch | None = None
        #: Failed holds blamed on the message after the position.
        self.fails = 0
        #: 1 while a failed batch's failure is not blamed on one of its messages yet.
        self.unblamed = 0
        #: The last message of the failed batch being taken apart ("" when none).
        self.until = ""
        #: Since when the key lingers, drained (monotonic; 0.0: it does not).
        self.lingering = 0.0
        #: When its last step was sent (monotonic): a wake after it may concern what it found.
        self.sent_at = 0.0

    def state(self, fails: Any, unblamed: Any, until: Any) -> None:
        self.fails, self.unblamed, self.until = int(fails), int(unblamed), text(until)

    def resumed(self) -> None:
        """The key woke from lingering: a new stretch of the hold for ``max_hold_*``."""
        self.started, self.processed = time.monotonic(), 0

    @property
    def isolating(self) -> bool:
        """One message at a time: a failed batch is being taken apart, or the head failed alone."""
        return bool(self.until) or self.fails > 0
