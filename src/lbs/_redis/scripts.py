"""The Lua scripts in ``lua/``: one builder per script and its result codes, in one place.

Each file is ``<name>-<number of keys>.lua`` (``n`` for a variable count) and
opens with a header documenting KEYS, ARGV and outputs; that header is the
contract (its source as sent, with the shared parts included:
:mod:`lbs._redis.sources`). Here each script has one builder that writes its
``EVALSHA`` into a :class:`_lbscore.CommandBatch` (KEYS and ARGV in the
header's order, commented per position) and, where its output is coded, the
enum of those codes; the done path's (``done-n``, ``release-1`` and the Lua-free pipeline) are in
:mod:`lbs._redis.done`, the keyed API's three (``publish-1``, ``fetch-1``,
``commit-1``) are in :mod:`lbs._redis.keyed_scripts` and named here too. Every
script has exactly one caller module in ``lbs._consumer`` (named on its
builder), but ``publish-1``, which ``lbs.publisher`` calls through redis-py
(``publish_args``). Batches go through :class:`lbs._redis.wire.Wire`, which
loads the sources again after a NOSCRIPT (a restart, a failover).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _lbscore import CommandBatch, Shape, try_decode_input

from ..exceptions import InternalError
from .done import DONE, RELEASE, DoneCode, done, done_codes, plain_codes, plain_done, release
from .keyed_scripts import (
    COMMIT,
    FETCH,
    PUBLISH,
    CommitCode,
    FetchCode,
    KeyCommit,
    commit,
    fail_delay,
    fail_mode,
    fetch,
    publish,
    publish_args,
)
from .reads import FENCE, NAMES
from .sources import Script, load, source
from .wire import text

__all__ = [
    "COMMIT",
    "DONE",
    "FETCH",
    "NO_DELAY",
    "PUBLISH",
    "RELEASE",
    "SCRIPTS",
    "CommitCode",
    "DoneCode",
    "FetchCode",
    "KeyCommit",
    "Reaped",
    "RequeueCode",
    "RequeueEntry",
    "Requeued",
    "RetryDelay",
    "Script",
    "commit",
    "done",
    "done_codes",
    "fail_delay",
    "fail_mode",
    "fetch",
    "plain_codes",
    "plain_done",
    "publish",
    "publish_args",
    "reap_reply",
    "release",
    "requeue_options",
    "requeue_replies",
    "requeue_reply",
    "source",
    "sources",
]

READ = load("read-3")
EXTEND = load("extend-n")
REQUEUE = load("requeue-6")
PROMOTE = load("promote-4")
REAP = load("reap-3")
LEAVE = load("leave-3")
SCRIPTS = (
    READ,
    EXTEND,
    DONE,
    RELEASE,
    NAMES,
    FENCE,
    REQUEUE,
    PROMOTE,
    REAP,
    LEAVE,
    PUBLISH,
    FETCH,
    COMMIT,
)


def sources() -> list[str]:
    """Every script's Lua source (what a NOSCRIPT reloads)."""
    return [s.source for s in SCRIPTS]


# ------------------------------------------------------------------ read-3 ---
# Caller: lbs._consumer.reader.


def read(
    b: CommandBatch,
    stream: str,
    fence: str,
    lease_key: str,
    group: str,
    consumer: str,
    count: int,
    lease: str,
    tokens: str = "",
) -> None:
    """Re-read up to ``count`` of this consumer's own pending entries (a read's reply was lost) under
    its lease (``lease_key`` must hold ``lease``, else the error "LEASE ..."); the reply is
    ``[entries, tokens]``, the entries as ``Entry`` objects, each with the fencing token its lost read
    recorded in ``tokens`` (the consumer's token records, for ``lbs status``) or a fresh one.
    """
    b.command(
        "EVALSHA",
        READ.sha,
        READ.fixed_keys,
        stream,  # KEYS[1] the LBS
        fence,  # KEYS[2] the fencing counter
        lease_key,  # KEYS[3] this consumer's lease
        group,  # ARGV[1]
        consumer,  # ARGV[2] consumer name in the group
        count,  # ARGV[3] COUNT
        lease,  # ARGV[4] the lease's value
        tokens,  # ARGV[5] the consumer's token records ("": none kept)
    )
    b.expect(Shape.SCRIPT_ENTRIES)


# ---------------------------------------------------------------- extend-n ---
# Caller: lbs._consumer.heartbeat.


def extend(
    b: CommandBatch,
    stream: str,
    consumers: str,
    lease_key: str,
    *,
    ttl_ms: int,
    group: str,
    consumer: str,
    lease: str,
    go: tuple[int, list[str], list[str]] | None = None,
) -> None:
    """Extend this consumer's lease (``lease_key`` holding ``lease``) and move its deadline. Beside a Go
    fleet ``go`` is (the Go-style locks' TTL in ms, the held entries' ids, their Go-style lock keys): each
    lock that is absent or ours is kept and its entry's idle time refreshed. The reply lists the negative
    positions of entries a Go consumer took, then notes ("LEASE ...": the lease is lost; "LBSKEY ...")."""
    go_args: list[str | int] = [] if go is None else [go[0], *go[1], *go[2]]
    b.command(
        "EVALSHA",
        EXTEND.sha,
        3,
        stream,  # KEYS[1] the LBS
        consumers,  # KEYS[2] the consumer deadline index
        lease_key,  # KEYS[3] this consumer's lease
        ttl_ms,  # ARGV[1] lease TTL
        group,  # ARGV[2]
        consumer,  # ARGV[3]
        lease,  # ARGV[4] the lease's value
        *go_args,  # ARGV[5..] beside a Go fleet
    )


# --------------------------------------------------------------- requeue-6 ---
# Caller: lbs._consumer.requeue.


@dataclass(frozen=True, slots=True)
class RetryDelay:
    """How long a re-queued copy stays parked: ``min(first_ms * 2**(n-1), max_ms) * jitter`` at retry count n.

    ``first_ms`` 0 re-queues at once; ``jitter`` is the caller's draw in
    [0.5, 1] (1 for a fixed delay: ``first_ms == max_ms``).
    """

    first_ms: int = 0
    max_ms: int = 0
    jitter: float = 1.0


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


# --------------------------------------------------------------- promote-4 ---
# Caller: lbs._consumer.delays.


def promote(
    b: CommandBatch,
    due: str,
    parked: str,
    stream: str,
    waiting: str,
    *,
    batch: int,
    group: str,
    key_prefix: str,
) -> None:
    """Move up to ``batch`` due parked copies back into the LBS and look at up to ``batch`` names due in the
    waiting index; output {moved, vanished, next ms, stuck, waiters put back}."""
    b.command(
        "EVALSHA",
        PROMOTE.sha,
        PROMOTE.fixed_keys,
        due,  # KEYS[1] the due index
        parked,  # KEYS[2] the parking stream
        stream,  # KEYS[3] the LBS
        waiting,  # KEYS[4] the waiting index
        batch,  # ARGV[1] most copies moved, most names looked at
        group,  # ARGV[2]
        key_prefix,
    )  # ARGV[3] {<service>-input}: (names' holders and waiting lists)


# ------------------------------------------------------------------- reap-3 ---
# Caller: lbs._consumer.recovery.


def reap(
    b: CommandBatch,
    consumers: str,
    stream: str,
    reaped: str,
    *,
    group: str,
    lease_prefix: str,
    batch: int,
    stall_ms: int,
    grace_ms: int,
    tokens_prefix: str = "",
) -> None:
    """Find the pending entries of overdue consumers whose lease is gone: the reply lists their ids, their
    holders and the holders' deadlines, for a re-queue under new ids (nothing is taken over)."""
    b.command(
        "EVALSHA",
        REAP.sha,
        REAP.fixed_keys,
        consumers,  # KEYS[1] the consumer deadline index
        stream,  # KEYS[2] the LBS
        reaped,  # KEYS[3] when the last call ran (server ms)
        group,  # ARGV[1]
        lease_prefix,  # ARGV[2] the lease key prefix
        batch,  # ARGV[3] most pending entries looked at
        stall_ms,  # ARGV[4] a longer gap since the last call is a stall
        grace_ms,  # ARGV[5] after a stall, each overdue consumer's grace
        tokens_prefix,
    )  # ARGV[6] the token records' prefix ("": none kept)


@dataclass(frozen=True, slots=True)
class Reaped:
    """``reap-3.lua``'s reply, read (:func:`reap_reply`)."""

    #: Each gone entry's id (text) with its holder and the holder's deadline (ms, text; "" when the
    #: reply does not say), oldest deadline's holder first.
    held: dict[str, tuple[str, str]]
    #: Seconds until the earliest deadline left in the index; None when it is empty.
    next_due: float | None
    #: The poll time this call wrote, as stored.
    stamp: bytes


def reap_reply(raw: Sequence[Any]) -> Reaped:
    """``{gone, next, stamp[, holders, deadlines]}`` read; another shape raises :class:`ValueError`."""
    if not 3 <= len(raw) <= 5:
        raise ValueError(f"reap-3.lua replied {raw!r}")
    gone, next_ms, stamp = raw[0], int(raw[1]), raw[2]
    names = [text(h) for h in raw[3]] if len(raw) > 3 else []
    pairs = raw[4] if len(raw) > 4 else []
    when = {text(pairs[i]): _whole_ms(pairs[i + 1]) for i in range(0, len(pairs) - 1, 2)}
    held = {}
    for k, entry_id in enumerate(gone):
        holder = names[k] if k < len(names) else ""
        held[text(entry_id)] = (holder, when.get(holder, ""))
    return Reaped(held, None if next_ms < 0 else next_ms / 1000, bytes(stamp))


def _whole_ms(score: Any) -> str:
    """A deadline index score as whole ms (text; "" when it is not a number)."""
    try:
        return str(int(float(text(score))))
    except ValueError:
        return ""


# ------------------------------------------------------------------ leave-3 ---
# Caller: lbs._consumer.instance.


def leave(
    b: CommandBatch,
    lease_key: str,
    stream: str,
    consumers: str,
    *,
    instance: str,
    group: str,
    consumer: str,
    grace_ms: int = 0,
    tokens_prefix: str = "",
) -> None:
    """A closing process (``instance``): delete its lease if still ours and its consumer if it has
    nothing pending. A sweep (``instance`` and ``consumer`` ""): delete every consumer with nothing pending
    idle at least ``grace_ms``."""
    b.command(
        "EVALSHA",
        LEAVE.sha,
        LEAVE.fixed_keys,
        lease_key,  # KEYS[1] the closing consumer's lease
        stream,  # KEYS[2] the LBS
        consumers,  # KEYS[3] the consumer deadline index
        instance,  # ARGV[1] our nonce ("": a sweep)
        group,  # ARGV[2]
        consumer,  # ARGV[3] the closing consumer ("": every consumer)
        grace_ms,  # ARGV[4] a sweep's grace
        tokens_prefix,
    )  # ARGV[5] the token records' prefix: a deleted consumer's go too
