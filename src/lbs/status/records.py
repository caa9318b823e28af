"""What :func:`lbs.status.collect_status` returns: frozen records of a service's state, JSON-ready.

Every record's ``to_dict()`` gives its fields as plain JSON types (nested records as dicts, tuples
as lists); ages and deadlines are ms of the server's clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

#: What a consumer looks like from Redis (see :attr:`ConsumerStatus.state`).
ConsumerState = Literal["alive", "late", "dead", "departed"]


class _Record:
    """``to_dict()`` for the frozen dataclasses below: their fields as plain JSON types."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


def _plain(value: Any) -> Any:
    if isinstance(value, _Record):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class HeldStream(_Record):
    """A data stream (or key) a consumer holds: one of its pending entries."""

    #: The data stream's name (a keyed service: the key); "" when the entry does not decode.
    stream: str
    entry_id: str
    #: The fencing token it is held under (its holder's token records); None when none is recorded.
    token: int | None
    #: ms since it was registered (its entry id's time against the server's TIME).
    age_ms: int
    #: ms since it was last delivered or refreshed by its holder's heartbeat.
    idle_ms: int


@dataclass(frozen=True)
class ConsumerStatus(_Record):
    """One consumer of the group, or of the deadline index."""

    #: Its name in the group (``redis-consumer-<id>``).
    name: str
    #: Whether ``XINFO CONSUMERS`` lists it (False: only the deadline index knows it).
    in_group: bool
    #: Entries pending to it: the data streams it holds.
    pending: int
    #: ms since its last attempted interaction with the group (``XINFO CONSUMERS`` idle); None if not in the group.
    idle_ms: int | None
    #: ms since its last successful interaction (Redis >= 7.2; None before, or never).
    inactive_ms: int | None
    #: ms until its deadline in the index (negative: past); None when it is not in the index.
    deadline_ms: int | None
    #: Its lease's remaining TTL in ms (-1: no TTL); None when it has no lease (dead, or gone).
    lease_ttl_ms: int | None
    #: What it holds, oldest entry first: among the service's first ``sample`` pending entries.
    held: tuple[HeldStream, ...] = ()

    @property
    def state(self) -> ConsumerState:
        """What Redis says of it, from lbs's own marks (the Go client leaves none):

        * ``alive``: its lease is there and its deadline, if it has one, is ahead;
        * ``late``: its lease is there but its deadline passed (a heartbeat is overdue, its
          lease is expiring), or it holds streams under a deadline still ahead while its lease
          is gone (it is dying);
        * ``dead``: no lease, and it still holds streams whose deadline passed (or never had one):
          they wait for recovery (every running client recovers them within the lease TTL + 1 s);
        * ``departed``: no lease and nothing held (it went away without a clean close, or its
          streams were recovered); a clean close takes its name out of the group, and the scan
          forgets a departed one after ``Config.forget_consumers_after``.
        """
        ahead = self.deadline_ms is not None and self.deadline_ms > 0
        if self.lease_ttl_ms is not None:
            return "alive" if self.deadline_ms is None or ahead else "late"
        if self.pending > 0:
            return "late" if ahead else "dead"
        return "departed"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, **super().to_dict()}


@dataclass(frozen=True)
class PendingEntry(_Record):
    """The oldest pending entry (smallest id): delivered, not finished."""

    id: str
    #: Who holds it.
    consumer: str
    #: ms since the entry was added to the LBS (its id's time against the server's TIME).
    age_ms: int
    #: ms since it was last delivered or claimed (a live holder's heartbeat refreshes it).
    idle_ms: int
    #: Times it was delivered.
    deliveries: int


@dataclass(frozen=True)
class WaitingEntry(_Record):
    """The oldest entry not yet delivered to the group."""

    id: str
    #: ms it has been waiting (its id's time against the server's TIME).
    age_ms: int


@dataclass(frozen=True)
class NameWait(_Record):
    """A data stream name whose registrations wait for its holder (one holder per name)."""

    name: str
    #: The LBS entry id holding the name: pending in the group, or (with :attr:`back`) the oldest
    #: waiter, put back into the LBS and not yet read.
    holder: str
    #: Whether :attr:`holder` is a waiter put back (nobody holds the name until it is read).
    back: bool
    #: Registrations waiting in the name's list.
    waiting: int


@dataclass(frozen=True)
class Requeued(_Record):
    """Re-queued copies among the newest waiting entries (what Redis keeps of recent recoveries)."""

    #: Waiting entries looked at (the newest ones, at most ``sample``).
    looked_at: int
    #: Whether that was every waiting entry.
    complete: bool
    #: Copies of an earlier entry (they carry ``_original_id``, or ``_replayed_from``): recovered,
    #: handed back or replayed.
    requeued: int
    #: Of these, with a failed attempt counted (``_retry_count`` > 0).
    retried: int
    #: Of these, replayed from the dead-letter stream (``_replayed_from``).
    replayed: int


@dataclass(frozen=True)
class ReasonCount(_Record):
    """One dead-letter reason and how many of the newest letters carry it."""

    reason: str
    count: int


@dataclass(frozen=True)
class Pause(_Record):
    """A service's pause: consumers take nothing new (``lbs pause``, :class:`lbs.ServiceControls`)."""

    by: str
    reason: str
    #: When it was paused (server ms; 0 when unknown) and for how long (ms).
    since_ms: int
    age_ms: int


@dataclass(frozen=True)
class DelayedRetries(_Record):
    """Entries parked in Redis until due: failed streams waiting out their retry delay, and
    scheduled registrations (``Producer.add_stream(..., delay=, at=)``, ``lbs register --in/--at``)."""

    #: The parking stream (``{<service>-input}:delayed``) and its length.
    stream: str
    parked: int
    #: The due index (``{<service>-input}:due``) and its size.
    due_key: str
    scheduled: int
    #: ms until the next one is due (negative: overdue, no client has moved it yet); None when none is.
    next_due_ms: int | None


@dataclass(frozen=True)
class KeyStatus(_Record):
    """A held key of keyed processing (:class:`lbs.Publisher`, ``run_keyed``), from a pending LBS entry."""

    key: str
    #: The consumer the LBS entry is delivered to, and the entry.
    consumer: str
    entry_id: str
    #: The last committed message id ("" for none yet).
    position: str
    #: Messages in the key's data stream (all after the position: committed ones are trimmed).
    backlog: int
    #: Holds that tried the position without committing past it (this one included).
    tries: int
    #: Whether the key's state names this entry as its holder (False: taken, not fetched yet, or a
    #: second registration that will be finished unprocessed).
    holder: bool
    #: Failed holds that may have involved the message after the position (0: none).
    failures: int = 0
    #: Whether the key is taken one message a hold, to find the message a failure came from.
    isolating: bool = False


@dataclass(frozen=True)
class ServiceStatus(_Record):
    """A service's state at one moment of the server's clock (see the module docstring)."""

    service: str
    #: The load-balancer stream's key, ``<service>-input``.
    stream: str
    group: str
    #: Whether the load-balancer stream exists. False: no such service here (the rest is empty or zero).
    exists: bool
    #: The server's version, and on a cluster the ``host:port`` of the master owning the service's slot.
    server_version: str
    node: str
    #: The server's TIME (ms since the epoch) of the first round trip.
    time_ms: int
    #: Entries in the load-balancer stream: waiting, pending, and re-queued copies.
    length: int
    group_exists: bool
    #: The group's last-delivered id ("" without a group).
    last_delivered_id: str
    #: Entries not yet delivered to the group.
    backlog: int
    #: False when :attr:`backlog` is an estimate (see :attr:`backlog_method`).
    backlog_exact: bool
    #: How the backlog was obtained: ``counted`` (the entries after the last-delivered id, or the length
    #: minus those up to it), ``lag`` (XINFO GROUPS), ``estimated`` (length minus pending), ``no group``
    #: (the length), ``none`` (no stream).
    backlog_method: str
    oldest_waiting: WaitingEntry | None
    #: Entries delivered and not finished (the group's pending list).
    pending: int
    oldest_pending: PendingEntry | None
    #: Alive, late and dead consumers first (most held first), then the departed, by name.
    consumers: tuple[ConsumerStatus, ...]
    requeued: Requeued
    #: The dead-letter stream's key ("" when dead letters are dropped) and its length.
    dead_letter_stream: str
    dead_letters: int
    #: Reasons of the newest :attr:`reasons_over` dead letters, most frequent first.
    reasons: tuple[ReasonCount, ...]
    reasons_over: int
    delayed: DelayedRetries | None = None
    #: Held keys of keyed processing, among the first ``sample`` pending entries, most backlog first
    #: (empty when the service's pending entries are not keys).
    keys: tuple[KeyStatus, ...] = ()
    #: Notes on anything odd that was read (e.g. a consumer id the index lists but the group does not).
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: The server's product: "Redis" or "Valkey" (:attr:`server_version` is its own version).
    server_name: str = "Redis"
    #: Data stream names with registrations waiting for their holder (the waiting index's size).
    names_waiting: int = 0
    #: The first of them (by when the sweep looks at them again), with their holders and waiters.
    waiting_names: tuple[NameWait, ...] = ()
    #: The service's pause (``lbs pause``), or None when it is not paused.
    paused: Pause | None = None

    def count(self, state: ConsumerState) -> int:
        """How many consumers are in ``state``."""
        return sum(1 for c in self.consumers if c.state == state)

    def to_dict(self) -> dict[str, Any]:
        """The whole status as plain JSON types (ages and deadlines in ms of the server's clock)."""
        out = super().to_dict()
        out["consumers"] = [c.to_dict() for c in self.consumers]
        out["keys"] = [k.to_dict() for k in self.keys]
        out["waiting_names"] = [w.to_dict() for w in self.waiting_names]
        out["consumer_states"] = {s: self.count(s) for s in ("alive", "late", "dead", "departed")}
        return out
