"""From what the round trips read to a :class:`ServiceStatus`: no I/O here.

The backlog (entries after the group's last-delivered id) is counted where that is cheap (see
:func:`count_backlog`); the re-queued copies are counted among the newest waiting entries; every
consumer of the group or of the deadline index gets its state from its deadline and its lease.
Also the reply readers every round shares (text, counters, reply maps, errors).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .. import _keys
from .._redis.connection import parse_version
from .._redis.wire import fields_text, text
from ..config import Config
from ..exceptions import RedisOperationError
from .records import (
    ConsumerStatus,
    DelayedRetries,
    Pause,
    PendingEntry,
    ReasonCount,
    Requeued,
    ServiceStatus,
    WaitingEntry,
)


def s(value: Any) -> str:
    """A reply value as text (bytes decoded as UTF-8, invalid bytes replaced); None as ""."""
    return "" if value is None else text(value, "replace")


def counter(value: str) -> int:
    """A counter of a key's state ("" or garbage: 0)."""
    return int(value) if value.isdigit() else 0


def keyed(d: Any) -> dict[str, Any]:
    """A reply map with text keys (RESP2 and RESP3 replies, decoded or not)."""
    return {s(k): v for k, v in dict(d).items()}


def check(what: str, reply: Any) -> Any:
    """A reply that must not be an error (the key types were checked first)."""
    if isinstance(reply, Exception):
        raise RedisOperationError(f"status ({what})", reply)
    return reply


@dataclass
class Target:
    """Which service a status read is about, and how much of it is read."""

    service: str
    config: Config
    letters: int
    sample: int
    #: The cluster master's ``host:port`` ("" when not a cluster).
    node: str
    prefix: str = field(init=False)
    stream: str = field(init=False)
    group: str = field(init=False)
    #: The dead-letter stream ("" when dead letters are dropped).
    dlq: str = field(init=False)
    #: The service's keys by role (see ``reader.ROLES``).
    keys: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        service = self.service
        self.prefix = self.config.field_prefix
        self.stream = _keys.input_stream(service)
        self.group = _keys.group_name(service)
        dlq = self.config.dead_letter_stream
        self.dlq = _keys.dead_letter_stream(service) if dlq is None else dlq
        self.keys = {
            "stream": self.stream,
            "consumers": _keys.consumers_key(service),
            "delayed": _keys.delayed_stream(service),
            "due": _keys.due_key(service),
            "waiting": _keys.waiting_key(service),
        }
        if self.dlq:
            self.keys["dead letters"] = self.dlq


@dataclass
class First:
    """What round trip 1 read."""

    now: int
    version: str  # the Redis version it is compatible with (what behaviour checks go by)
    product: tuple[
        str, str
    ]  # ("Redis", "8.6.3"), ("Valkey", "9.0.1"); ("", "") when INFO is refused
    exists: bool
    length: int
    group: dict[str, Any] | None
    in_group: list[dict[str, Any]]
    pending: int
    oldest_pending: PendingEntry | None
    deadlines: dict[str, int]
    dead_letters: int
    newest_letters: list[Any]
    delayed: DelayedRetries | None
    names_waiting: int
    paused: Pause | None = None


@dataclass
class Second:
    """What round trip 2 read."""

    now: int
    markers: dict[str, int | None]
    length: int = 0
    oldest_waiting: WaitingEntry | None = None
    newest_waiting: list[Any] = field(default_factory=list)
    #: The entries up to the last-delivered id (None when not read).
    delivered: list[Any] | None = None


def count_backlog(t: Target, first: First, second: Second) -> tuple[int, bool, str]:
    """(backlog, exact, method): counted where that is cheap. Redis's lag goes wrong after deletions
    before 7.4 (redis/redis#13338), and is nil after most of lbs's own (a finished entry is deleted)."""
    waiting, delivered = second.newest_waiting, second.delivered
    if not first.exists:
        return 0, True, "none"
    if first.group is None:
        return first.length, True, "no group"
    if t.sample and len(waiting) < t.sample:
        return len(waiting), True, "counted"
    if delivered is not None and len(delivered) < t.sample:
        return max(0, second.length - len(delivered)), True, "counted"
    lag = first.group.get("lag")
    if lag is not None:
        return int(lag), parse_version(first.version) >= (7, 4), "lag"
    return max(0, first.length - first.pending, len(waiting)), False, "estimated"


def count_requeued(t: Target, second: Second, backlog: int, exact: bool) -> Requeued:
    """The re-queued copies among the newest waiting entries."""
    waiting = second.newest_waiting
    requeued = retried = replayed = 0
    for _id, raw in waiting:
        f = fields_text(raw)
        again = (t.prefix + "replayed_from") in f
        if again or (t.prefix + "original_id") in f:
            requeued += 1
            replayed += again
            try:
                retried += int(f.get(t.prefix + "retry_count", "0")) > 0
            except ValueError:
                pass
    complete = len(waiting) < t.sample or (exact and len(waiting) >= backlog)
    return Requeued(len(waiting), complete, requeued, retried, replayed)


def list_consumers(first: First, second: Second, notes: list[str]) -> tuple[ConsumerStatus, ...]:
    """Every consumer of the group or of the deadline index; alive, late and dead ones first, most held
    first, then the departed by name."""
    now, deadlines, markers = first.now, first.deadlines, second.markers
    rows = []
    for c in first.in_group:
        name = s(c.get("name"))
        inactive = c.get("inactive")  # Redis >= 7.2; -1: never
        rows.append(
            ConsumerStatus(
                name,
                True,
                int(c.get("pending") or 0),
                int(c.get("idle") or 0),
                None if inactive is None or int(inactive) < 0 else int(inactive),
                deadlines[name] - now if name in deadlines else None,
                markers.get(name),
            )
        )
    for name in sorted(set(deadlines) - {c.name for c in rows}):
        notes.append(f"{name} is in the deadline index but not in the group")
        rows.append(
            ConsumerStatus(name, False, 0, None, None, deadlines[name] - now, markers.get(name))
        )
    order = {"dead": 0, "late": 1, "alive": 2, "departed": 3}
    rows.sort(
        key=lambda c: (
            c.state == "departed",
            -c.pending if c.state != "departed" else 0,
            order[c.state],
            c.name,
        )
    )
    return tuple(rows)


def assemble(t: Target, first: First, second: Second) -> ServiceStatus:
    """The status from round trips 1 and 2 (rounds 3 to 6 are added by the reader)."""
    notes: list[str] = []
    consumers = list_consumers(first, second, notes)
    backlog, exact, method = count_backlog(t, first, second)
    reasons: Counter[str] = Counter(
        fields_text(fields).get(t.prefix + "reason", "") for _id, fields in first.newest_letters
    )
    return ServiceStatus(
        service=t.service,
        stream=t.stream,
        group=t.group,
        exists=first.exists,
        server_name=first.product[0] or "Redis",
        server_version=first.product[1] or first.version,
        node=t.node,
        time_ms=first.now,
        length=first.length,
        group_exists=first.group is not None,
        last_delivered_id=s(first.group.get("last-delivered-id")) if first.group else "",
        backlog=backlog,
        backlog_exact=exact,
        backlog_method=method,
        oldest_waiting=second.oldest_waiting,
        pending=first.pending,
        oldest_pending=first.oldest_pending,
        consumers=consumers,
        requeued=count_requeued(t, second, backlog, exact),
        dead_letter_stream=t.dlq,
        dead_letters=first.dead_letters,
        reasons=tuple(ReasonCount(r, n) for r, n in reasons.most_common()),
        reasons_over=len(first.newest_letters),
        delayed=first.delayed,
        notes=tuple(notes),
        names_waiting=first.names_waiting,
        paused=first.paused,
    )
