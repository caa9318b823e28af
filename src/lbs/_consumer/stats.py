"""What a client did since it started: :class:`ClientStats`, the counters metrics read."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..metrics import Histogram

__all__ = ["ClientStats", "Histogram"]


@dataclass(slots=True)
class ClientStats:
    """What a client did since it started: plain counters, updated as it goes.

    These are what metrics read (``lbs-prometheus`` at scrape time): keeping
    them costs an integer add, and nothing is called per assignment.
    """

    #: Streams taken (held under the lease and handed to the application).
    taken: int = 0
    #: Streams finished (``done_stream`` or a returning ``run()`` handler), whatever the outcome.
    finished: int = 0
    #: ... of which still ours (``DoneStatus.DONE``).
    done: int = 0
    #: ... of which ``LOCK_EXPIRED``: never under the consumer lease (stays 0; kept for compatibility).
    lock_expired: int = 0
    #: ... of which lost: the lease they were read under had lapsed, or they were handed on (``LOCK_LOST``).
    lock_lost: int = 0
    #: ``run()`` handlers that raised (or were cancelled by someone else) ...
    handler_failures: int = 0
    #: ... and those that ran past their timeout (counted apart, not in handler_failures).
    handler_timeouts: int = 0
    #: Streams handed back to the LBS (``hand_back``, failed handlers, shutdown).
    handed_back: int = 0
    #: Assignments this client sent to the dead-letter stream (or dropped, without one).
    dead_lettered: int = 0
    #: Failed streams parked to come back after their retry delay (``Config.retry_delay``).
    retries_delayed: int = 0
    #: Heartbeat ticks that went through, and when the last one did (``time.monotonic()``; 0: none yet).
    heartbeats: int = 0
    heartbeat_at: float = 0.0
    #: How long ``run()`` handlers ran, returned or raised (seconds).
    handler_seconds: Histogram = field(default_factory=Histogram)
    #: Messages committed by ``run_keyed()`` handlers.
    keyed_messages: int = 0
