"""One service's state, read from Redis in two pipelined round trips (``lbs status``).

:func:`collect_status` reads everything lbs keeps for a service and returns
a frozen :class:`ServiceStatus` (``to_dict()`` is JSON-ready):

* the load-balancer stream: its length, the **backlog** (entries not yet
  delivered to the group) with how it was obtained, the oldest waiting entry
  and, among the newest waiting entries, how many are re-queued copies
  (``_original_id``), with a retry counted (``_retry_count`` > 0) or
  replayed from the dead-letter stream (``_replayed_from``);
* the group's **pending** entries (delivered, not finished) and the oldest of
  them (its age from its id, its idle time, its holder);
* every **consumer** from ``XINFO CONSUMERS`` and the deadline index: held
  streams (with the token each is held under), idle time, seconds to its deadline, its lease, and
  whether it is alive, late, dead (still holding streams that wait for
  recovery) or departed (left, nothing held);
* the **dead-letter stream**: its length and the reasons of its newest letters;
* the parked **delayed retries** (``{<service>-input}:delayed`` and its due index);
* the registrations **waiting for their data stream's holder** (one holder per
  name): how many names have waiters and, for the first of them, the holding
  entry and how many wait (rounds 5 and 6, only when some do).

:func:`list_services` names the services on a Redis (every master of a cluster: each stream
``<service>-input``), :func:`service_summaries` counts each one (``lbs services``), and
:func:`require_service` is the operator's tools' check of a service's name
(:class:`lbs.NoSuchServiceError`, with the closest names there are): :mod:`lbs.status.services`.
:func:`collect_shards` reads a sharded service's shards (each one's slot, the master owning it, its
status; the legacy shards that still exist; how many shards each master owns): :mod:`lbs.status.shards`.

Round trip 1 is one MULTI/EXEC (a consistent snapshot, with the server's
``TIME``): key types, lengths, the group, its consumers, the pending summary,
the deadline index, the newest dead letters, the parked retries. Round trip 2,
also one MULTI/EXEC with its own ``TIME``, reads what depends on the first: the
entries around the group's last-delivered id and each consumer's lease. Every age and deadline is the server's clock against the server's
clock, never the caller's.

Redis stores no history of recoveries (their counters live in each client's
metrics), so what can be computed from Redis alone is reported: re-queued
copies still waiting in the LBS, and the dead-letter reasons.

The backlog (entries after the group's last-delivered id) is counted where
that is cheap: the waiting entries themselves when there are fewer than
``sample``, else the entries up to the last-delivered id (the pending ones,
mostly) when there are fewer than ``sample``, subtracted from the length
(``backlog_method`` ``counted``). Only past both is Redis's ``XINFO GROUPS``
lag used (``lag``; exact from Redis 7.4: before, deletions make it wrong,
redis/redis#13338, and lbs deletes every finished entry), or, when Redis
has none, length minus pending (``estimated``). ``backlog_exact`` says which.
"""

from __future__ import annotations

from .held import WAITING_NAMES_SHOWN
from .reader import collect_status
from .records import (
    ConsumerState,
    ConsumerStatus,
    DelayedRetries,
    HeldStream,
    KeyStatus,
    NameWait,
    PendingEntry,
    ReasonCount,
    Requeued,
    ServiceStatus,
    WaitingEntry,
)
from .services import ServiceSummary, list_services, require_service, service_summaries
from .shards import ShardedStatus, ShardStatus, collect_shards

__all__ = [
    "WAITING_NAMES_SHOWN",
    "ConsumerState",
    "ConsumerStatus",
    "DelayedRetries",
    "HeldStream",
    "KeyStatus",
    "NameWait",
    "PendingEntry",
    "ReasonCount",
    "Requeued",
    "ServiceStatus",
    "ServiceSummary",
    "ShardStatus",
    "ShardedStatus",
    "WaitingEntry",
    "collect_shards",
    "collect_status",
    "list_services",
    "require_service",
    "service_summaries",
]
