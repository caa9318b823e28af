"""The Lua scripts in ``lua/``: one builder per script and its result codes, in one place.

Each file is ``<name>-<number of keys>.lua`` (``n`` for a variable count) and
opens with a header documenting KEYS, ARGV and outputs; that header is the
contract (its source as sent, with the shared parts included:
:mod:`lbs._redis.sources`). Here each script has one builder that writes its
``EVALSHA`` into a :class:`_lbscore.CommandBatch` (KEYS and ARGV in the
header's order, commented per position) and, where its output is coded, the
enum of those codes and the typed reader of its reply; the done path's (``done-n``, ``release-1`` and the Lua-free pipeline) are in
:mod:`lbs._redis.done`, ``requeue-6``'s (its builder, packed switches, codes and reply reader) in
:mod:`lbs._redis.requeues`, the keyed API's three (``publish-1``, ``fetch-1``,
``commit-1``) are in :mod:`lbs._redis.keyed_scripts` and named here too. Every
script has exactly one caller module in ``lbs._consumer`` (named on its
builder), but ``publish-1``, which ``lbs.publisher`` calls through redis-py
(``publish_args``). Batches go through :class:`lbs._redis.wire.Wire`, which
loads the sources again after a NOSCRIPT (a restart, a failover).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _lbscore import CommandBatch, Shape

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
from .requeues import (
    NO_DELAY,
    REQUEUE,
    RequeueCode,
    Requeued,
    RequeueEntry,
    RetryDelay,
    requeue,
    requeue_options,
    requeue_replies,
    requeue_reply,
)
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
    "Left",
    "Promoted",
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
    "leave_reply",
    "plain_codes",
    "plain_done",
    "promote_reply",
    "publish",
    "publish_args",
    "reap_reply",
    "release",
    "requeue",
    "requeue_options",
    "requeue_replies",
    "requeue_reply",
    "source",
    "sources",
]

READ = load("read-3")
EXTEND = load("extend-n")
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


@dataclass(frozen=True, slots=True)
class Promoted:
    """``promote-4.lua``'s reply, read (:func:`promote_reply`)."""

    #: Copies put back into the LBS.
    moved: int
    #: Due ids whose parked entry was gone (dropped from the due index).
    vanished: int
    #: Seconds until the next copy is due (0: more are due now); None when nothing more is parked.
    next_due: float | None
    #: Copies too wide to move (rescored to +inf).
    stuck: int
    #: Waiting registrations put back by the sweep of names whose holder vanished.
    waiters: int


def promote_reply(raw: Sequence[Any]) -> Promoted:
    """``{moved, vanished, next, stuck, names}`` read; another shape raises :class:`ValueError`."""
    if len(raw) != 5:
        raise ValueError(f"promote-4.lua replied {raw!r}")
    moved, vanished, next_ms, stuck, waiters = (int(v) for v in raw)
    return Promoted(moved, vanished, None if next_ms < 0 else next_ms / 1000, stuck, waiters)


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
    except (ValueError, OverflowError):
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


@dataclass(frozen=True, slots=True)
class Left:
    """``leave-3.lua``'s reply, read (:func:`leave_reply`)."""

    #: Whether the lease was deleted (it held this process's value and nothing was pending).
    lease_deleted: bool
    #: Consumers deleted from the group.
    consumers_deleted: int


def leave_reply(raw: Sequence[Any]) -> Left:
    """``{lease deleted, consumers deleted}`` read; another shape raises :class:`ValueError`."""
    if len(raw) != 2:
        raise ValueError(f"leave-3.lua replied {raw!r}")
    return Left(bool(int(raw[0])), int(raw[1]))
