"""``requeue-6.lua``: its builder, the client's packed switches, its result codes and its reply's reader.

Re-exported by :mod:`lbs._redis.scripts` (where every script is named); the one caller is
:mod:`lbs._consumer.requeue`.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _lbscore import CommandBatch, try_decode_input

from ..exceptions import InternalError
from .sources import load
from .wire import text

__all__ = [
    "NO_DELAY",
    "REQUEUE",
    "RequeueCode",
    "RequeueEntry",
    "Requeued",
    "RetryDelay",
    "requeue",
    "requeue_options",
    "requeue_replies",
    "requeue_reply",
]

REQUEUE = load("requeue-6")


@dataclass(frozen=True, slots=True)
class RetryDelay:
    """How long a call's re-queued copies stay parked: ``min(first_ms * 2**(n-1), max_ms) * jitter`` at
    retry count n, the jitter each entry's own (:attr:`RequeueEntry.jitter`).

    ``first_ms`` 0 re-queues at once.
    """

    first_ms: int = 0
    max_ms: int = 0


#: Re-queue at once.
NO_DELAY = RetryDelay()


def requeue_options(
    *,
    group: str,
    max_retries: int,
    retry_field: str,
    original_field: str,
    consumer: str,
    dead_letter_on: bool,
    field_prefix: str,
    go_lock_sep: str = "",
    queued_prefix: str = "",
    key_prefix: str = "",
    min_idle_ms: int = 0,
) -> str:
    """A client's switches for ``requeue-6.lua`` (its ARGV[1]), packed once per client as the header's
    JSON array. ``min_idle_ms`` (beside a Go fleet, 1 s or the lease TTL when shorter): mode "absent"
    leaves an entry idle less than that to the Go consumer that just claimed it."""
    return json.dumps(
        [
            group,  # [1]
            max_retries,  # [2] past it: dead-lettered
            retry_field,  # [3]
            original_field,  # [4]
            consumer,  # [5] our consumer id (the holder in modes "owned"/"restart"; in dead letters)
            1 if dead_letter_on else 0,  # [6] a dead-letter stream is configured
            field_prefix,  # [7] the managed-field prefix
            go_lock_sep,  # [8] Go-style lock separator ("": not checked)
            queued_prefix,  # [9] queued sets: what a holder merely held counts no death
            key_prefix,  # [10] names released ("": untouched)
            min_idle_ms,  # [11] mode "absent" beside Go: idle less is just claimed
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class RequeueEntry:
    """One entry of a ``requeue-6.lua`` call: its id, the reason kept in a dead letter, the jitter of its
    retry delay, (mode "owned" beside a Go fleet) its DataStreamName, whose Go-style lock is released
    with it, and the fields set on its copy (names and values, flat: hook ``lbs_hand_back_fields``)."""

    entry_id: str
    reason: str = ""
    jitter: float = 1.0
    stream_name: str = ""
    fields: Sequence[str] = ()


def requeue(
    b: CommandBatch,
    stream: str,
    dead_letters: str,
    lease_prefix: str,
    parked: str,
    due: str,
    pardons: str,
    *,
    options: str,
    mode: str,
    value: str,
    count_retry: bool,
    force_dead_letter: bool,
    traceback: str = "",
    delay: RetryDelay = NO_DELAY,
    entries: Sequence[RequeueEntry],
) -> None:
    """Put assignments back as fresh entries, park them for ``delay`` (its jitter: each entry's), or put
    them into the dead-letter stream; the reply is one ``[code, detail, ...]`` per entry (codes:
    :class:`RequeueCode`). ``options``: :func:`requeue_options`, packed once per client."""
    args: list[str | int] = []
    for e in entries:
        args += [e.entry_id, e.reason, repr(e.jitter), e.stream_name, len(e.fields) // 2, *e.fields]
    b.command(
        "EVALSHA",
        REQUEUE.sha,
        REQUEUE.fixed_keys,
        stream,  # KEYS[1] the LBS
        dead_letters,  # KEYS[2] the dead-letter stream
        lease_prefix,  # KEYS[3] the lease key prefix (declared for its slot)
        parked,  # KEYS[4] the parking stream
        due,  # KEYS[5] the due index
        pardons,  # KEYS[6] deaths taken back (a holder that lived)
        options,  # ARGV[1] the client's switches
        mode,  # ARGV[2] "owned", "absent", "restart" or "any"
        value,  # ARGV[3] our lease value (modes "owned", "restart")
        1 if count_retry else 0,  # ARGV[4] retry increment
        1 if force_dead_letter else 0,  # ARGV[5] dead-letter unconditionally
        traceback,  # ARGV[6] recorded in dead letters ("": none)
        delay.first_ms,  # ARGV[7] delay at retry 1 (ms); 0: at once
        delay.max_ms,  # ARGV[8] longest delay (ms)
        *args,  # ARGV[9]... per entry: id, reason, jitter, name, n, n field pairs
    )


class RequeueCode(enum.IntEnum):
    """First element of the output of ``requeue-6.lua``."""

    #: A key had the wrong type (the detail names it): nothing was touched.
    REFUSED = -2
    TRIMMED = -1
    SKIPPED = 0
    REQUEUED = 1
    DEAD_LETTERED = 2
    DROPPED = 3
    #: Parked: the detail is its id in the parking stream, the fifth element its delay (ms).
    PARKED = 4


@dataclass(frozen=True, slots=True)
class Requeued:
    """One entry's reply of ``requeue-6.lua``, read (:func:`requeue_reply`)."""

    code: RequeueCode
    #: The copy's id (re-queued, parked: in the parking stream), the dead letter's, why it was skipped
    #: (``lock``, ``acked``, ...) or the refusal (``LBSKEY <key> holds ...``).
    detail: str
    #: Its DataStreamName ("": none, undecodable, or the entry was not read).
    stream: str = ""
    #: The copy's retry count.
    retries: int = 0
    #: How long it is parked (ms; code PARKED).
    delay_ms: int = 0


def requeue_reply(raw: Sequence[Any]) -> Requeued:
    """One entry's ``{code, detail[, lbs-input, retries[, delay]]}``, read; a reply of another shape
    raises :class:`ValueError`."""
    if not 2 <= len(raw) <= 5:
        raise ValueError(f"requeue-6.lua replied {raw!r} for an entry")
    code = RequeueCode(int(raw[0]))
    stream = (try_decode_input(raw[2])[0] or "") if len(raw) >= 3 else ""
    retries = int(raw[3]) if len(raw) >= 4 else 0
    delay = int(raw[4]) if len(raw) == 5 else 0
    return Requeued(code, text(raw[1]), stream, retries, delay)


def requeue_replies(raw: Sequence[Any]) -> list[Requeued | Exception]:
    """A call's reply, one :class:`Requeued` per entry; an entry's reply of another shape is that
    entry's error alone (:class:`lbs.InternalError`)."""
    out: list[Requeued | Exception] = []
    for one in raw:
        try:
            out.append(requeue_reply(one))
        except (ValueError, TypeError) as exc:
            out.append(InternalError(f"requeue-6.lua replied what it never does: {exc}"))
    return out
