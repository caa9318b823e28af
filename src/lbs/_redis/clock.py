"""The server's clock as a client sees it: the heartbeat dates its deadline by it
(:mod:`lbs._redis.beat`), recovery's idle look the last poll's time (:mod:`lbs._consumer.recovery`).
"""

from __future__ import annotations

from typing import Any

from .wire import text

__all__ = ["ServerClock"]


class ServerClock:
    """The server's clock as seen from this client's monotonic clock: each ``TIME`` reply is pinned to
    the middle of the round trip that read it, so an estimate is off by at most half that round trip
    (plus the clocks' drift since, microseconds a tick). A failover to a server whose clock differs is
    corrected by the next ``TIME``."""

    __slots__ = ("_at", "_ms")

    def __init__(self) -> None:
        self._ms: float | None = None  # the server's time (ms) at ...
        self._at = 0.0  # ... this monotonic time (s)

    def note(self, reply: Any, sent: float, received: float) -> bool:
        """Record a ``TIME`` reply (``[seconds, microseconds]``) read by a round trip sent at ``sent``
        and answered at ``received`` (monotonic seconds); False when it is not one."""
        try:
            seconds, micros = (int(text(v)) for v in reply)
        except (TypeError, ValueError):
            return False
        self.pin(seconds * 1000 + micros / 1000, sent, received)
        return True

    def pin(self, server_ms: float, sent: float, received: float) -> None:
        """Record the server's time ``server_ms`` (ms), read by a round trip sent at ``sent`` and
        answered at ``received`` (monotonic seconds)."""
        self._ms = server_ms
        self._at = (sent + received) / 2

    def now_ms(self, at: float) -> int | None:
        """The server's time (ms) at monotonic time ``at``; None before the first :meth:`note`."""
        if self._ms is None:
            return None
        return int(self._ms + (at - self._at) * 1000)
