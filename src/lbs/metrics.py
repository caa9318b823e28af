"""The one table of lbs's metric names: what the ``lbs_metric`` hook reports.

Every metric event lbs emits has an entry in :data:`METRICS`, which gives its
kind, a one-sentence help text and the labels it carries beyond ``service``
and ``consumer`` (always there). This table is read by the ``lbs_metric``
hookspec's docstring (:mod:`lbs.hookspecs` renders it there at import), by
``lbs-prometheus`` for its help texts and kinds, and by the tests
(``tests/unit/test_metrics.py`` checks that every name emitted in
``src/lbs`` is here and every entry is emitted somewhere). A name is
stable: a metrics plugin may map it 1:1. A name not in the table (another
plugin's) is still a metric, not an error. :class:`Histogram` keeps a
histogram's observations in fixed buckets (a client's handler times, the
``Hooks``' series).

.. versionadded:: 0.1
"""

from __future__ import annotations

import dataclasses
import re
from bisect import bisect_left
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

Kind = Literal["counter", "gauge", "histogram"]

#: What the ``kind`` of an ``lbs_metric`` event can be: ``counter`` (``value``
#: is an increment), ``gauge`` (the new value), ``histogram`` (one observation).
KINDS: Final[tuple[Kind, ...]] = get_args(Kind)

#: The labels every event carries; :attr:`Metric.labels` are the extra ones.
BASE_LABELS: Final[tuple[str, ...]] = ("service", "consumer")

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric lbs emits through the ``lbs_metric`` hook."""

    #: Stable name, snake_case, without a prefix (``lbs-prometheus`` adds ``lbs_``).
    name: str
    #: ``counter``, ``gauge`` or ``histogram``.
    kind: Kind
    #: One sentence saying what is counted, set or observed.
    help: str
    #: Labels beyond ``service`` and ``consumer``, in order.
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"metric name {self.name!r} is not snake_case")
        if self.kind not in KINDS:
            raise ValueError(f"metric {self.name!r} has unknown kind {self.kind!r}")
        if not self.help.strip():
            raise ValueError(f"metric {self.name!r} has no help text")
        if set(self.labels) & set(BASE_LABELS) or len(set(self.labels)) != len(self.labels):
            raise ValueError(
                f"metric {self.name!r}: labels {self.labels} repeat one, or one of {BASE_LABELS}"
            )


def _table(*metrics: Metric) -> Mapping[str, Metric]:
    by_name = {m.name: m for m in metrics}
    if len(by_name) != len(metrics):
        raise ValueError("a metric name appears twice in the table")
    return MappingProxyType(by_name)


#: Every metric lbs emits, by name (read-only).
METRICS: Final[Mapping[str, Metric]] = _table(
    # -- recovery, by path: one per entry re-queued as a fresh entry ---------------
    Metric(
        "recovery_keyspace_requeued_total",
        "counter",
        "Entries re-queued by the deadline poll that a lease's expiry keyspace event started.",
    ),
    Metric(
        "recovery_deadline_requeued_total",
        "counter",
        "Entries re-queued by the periodic deadline poll because their holder's heartbeat deadline passed.",
    ),
    Metric(
        "recovery_scan_requeued_total",
        "counter",
        "Entries re-queued by the pending-list scan because their holder's lease was gone.",
    ),
    Metric(
        "recovery_startup_requeued_total",
        "counter",
        "Entries of this consumer id re-queued by start-up recovery: what an earlier process under this id "
        "left pending.",
    ),
    Metric(
        "recovery_claim_requeued_total",
        "counter",
        "Entries re-queued through Client.claim() because their holder's lease was gone.",
    ),
    Metric(
        "recovery_heartbeat_requeued_total",
        "counter",
        "Entries this client's heartbeat re-queued, without a retry counted, after finding its lease lost "
        "while it held them.",
    ),
    Metric(
        "consumers_forgotten_total",
        "counter",
        "Departed consumers (nothing pending, idle past Config.forget_consumers_after) deleted from the group.",
    ),
    # -- recovery, other outcomes (label path: which of the six found the entry) ----
    Metric(
        "recovery_dlq_total",
        "counter",
        "Entries recovery found out of retries and dead-lettered (or dropped, without a dead-letter stream).",
        ("path",),
    ),
    Metric(
        "recovery_trimmed_total",
        "counter",
        "Pending entries recovery found already trimmed from the stream, whose pending reference it cleaned.",
        ("path",),
    ),
    Metric(
        "recovery_duplicate_ack_total",
        "counter",
        "Entries recovery meant to re-queue that were no longer pending (finished or recovered elsewhere first).",
        ("path",),
    ),
    # -- the pending-list scan --------------------------------------------------------
    Metric(
        "recovery_scan_skipped_alive_total",
        "counter",
        "Pending entries the scan left alone because their holder's lease was alive.",
    ),
    Metric(
        "recovery_scan_duration_seconds",
        "histogram",
        "Duration of one full pass of the pending-list scan.",
    ),
    # -- keyspace events ------------------------------------------------------------
    Metric(
        "recovery_expiry_lag_seconds",
        "histogram",
        "How long after the holder's heartbeat deadline a lease's expiry keyspace event led to a re-queue.",
    ),
    Metric(
        "keyspace_listener_reconnects_total",
        "counter",
        "Times the keyspace-event listener subscribed again after losing its subscription.",
    ),
    Metric(
        "keyspace_listener_gap_seconds",
        "histogram",
        "How long the keyspace-event listener was unsubscribed before it subscribed again.",
    ),
    # -- start-up recovery ----------------------------------------------------------
    Metric(
        "startup_recovery_duration_seconds",
        "histogram",
        "Duration of one start-up recovery pass, which start() runs before the reader starts.",
    ),
    Metric(
        "startup_recovery_success",
        "gauge",
        "1 when the last start-up recovery pass finished, 0 when it failed.",
    ),
    # -- reading, heartbeats, finishing, handing back -------------------------------
    Metric(
        "streams_waiting_total",
        "counter",
        "Registrations this client read whose data stream was held under another registration: parked in "
        "the name's waiting list, back in the load-balancer stream once the holder releases the name.",
    ),
    Metric(
        "read_failures_total",
        "counter",
        "Reads of new work that failed (each is retried with back-off until Config.read_max_retries).",
    ),
    Metric(
        "rate_limit_waits_total",
        "counter",
        "Times the reader waited for the next window of the service's rate limit (Config.rate_limit): "
        "its window given out, or this consumer's slice of it taken.",
    ),
    Metric(
        "heartbeat_failures_total",
        "counter",
        "Heartbeat ticks that failed (the next is tried soon, before the lease can expire).",
    ),
    Metric(
        "late_replies_total",
        "counter",
        "Streams a read took whose reply was read too late to start them (the process was frozen while "
        "Redis answered): handed back, no retry counted, no handler started.",
    ),
    Metric(
        "lease_expired_total",
        "counter",
        "Streams disowned locally because no heartbeat confirmed the lease for a lease TTL (a partition).",
    ),
    Metric(
        "pardoned_total",
        "counter",
        "Streams lost while this consumer lived that another consumer's recovery took over: their counted "
        "death is taken back.",
    ),
    Metric(
        "duplicate_consumer_total",
        "counter",
        "Heartbeat ticks that found another live process running with this consumer id.",
    ),
    Metric(
        "held_overdue",
        "gauge",
        "Streams held longer than Config.hold_warning without being finished, at the last heartbeat's check.",
    ),
    Metric(
        "done_failures_total",
        "counter",
        "Streams whose batched finishing call failed (retried when Redis was unreachable or failing over).",
    ),
    Metric(
        "hand_back_failures_total",
        "counter",
        "Held streams whose hand-back in close() failed: they stay pending until the lease expires, and "
        "recovery brings them back.",
    ),
    Metric(
        "wrong_type_keys_total",
        "counter",
        "Script calls refused because one of the service's keys had the wrong type.",
    ),
    # -- dead letters (label backend: the backend's name) ------------------------------
    Metric(
        "dead_letters_forwarded_total",
        "counter",
        "Dead letters the backend wrote, then deleted from the dead-letter stream by the forwarder.",
        ("backend",),
    ),
    Metric(
        "dead_letters_forward_failures_total",
        "counter",
        "Batches of dead letters whose write to the backend failed (they stay in the stream and are "
        "written again).",
        ("backend",),
    ),
    # -- the service's queues (the same for every client of the service: take the max) ---
    Metric(
        "backlog_depth",
        "gauge",
        "Entries in the load-balancer stream not yet delivered to the consumer group, sampled every "
        "Config.metrics_interval.",
    ),
    Metric(
        "pel_depth",
        "gauge",
        "Entries in the consumer group's pending list (delivered, not yet finished), sampled every "
        "Config.metrics_interval and after each scan.",
    ),
    Metric(
        "dead_letter_depth",
        "gauge",
        "Entries in the dead-letter stream, sampled every Config.metrics_interval (not sampled when dead "
        "letters are dropped).",
    ),
    # -- the server -----------------------------------------------------------------
    Metric(
        "go_taken_total",
        "counter",
        "Streams a Go reference client consumer took while this client held them (Config.go_compatible: "
        "its Go-style lock held another name, or at done the entry was pending under another consumer); "
        "none of them was finished here.",
    ),
    Metric(
        "topology_changes_total",
        "counter",
        "Times the client moved to a new cluster master owning its service's slot.",
    ),
    Metric(
        "server_restarts_total",
        "counter",
        "Server restarts the client noticed because the server's run id changed.",
    ),
)


def render_rst() -> str:
    """:data:`METRICS` as a reST definition list (one entry per metric), for docstrings.

    Lines are not indented and end with a newline; indent them to fit.
    """
    out = []
    for m in METRICS.values():
        what: str = m.kind
        if m.labels:
            what += (
                "; label"
                + "s" * (len(m.labels) > 1)
                + " "
                + ", ".join(f"``{lb}``" for lb in m.labels)
            )
        out.append(f"``{m.name}`` ({what})\n    {m.help}\n")
    return "".join(out)


def render_markdown() -> str:
    """:data:`METRICS` as a Markdown table (name, kind, extra labels, help), for ``docs/PLUGINS.md``."""
    rows = ["| name | kind | labels | help |", "| --- | --- | --- | --- |"]
    for m in METRICS.values():
        labels = ", ".join(f"`{lb}`" for lb in m.labels)
        rows.append(f"| `{m.name}` | {m.kind} | {labels} | {m.help.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


class Histogram:
    """Observations in fixed buckets (cumulative on read, like Prometheus): an ``observe`` is a bisect and two adds."""

    #: Upper bounds in seconds (Prometheus's default buckets); +Inf is implied.
    BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        #: Observations per bucket, not cumulative; the last one is +Inf.
        self.counts = [0] * (len(self.BOUNDS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.BOUNDS, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, ending with ``(inf, count)``."""
        out, total = [], 0
        for bound, n in zip((*self.BOUNDS, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out


__all__ = [
    "BASE_LABELS",
    "KINDS",
    "METRICS",
    "Histogram",
    "Kind",
    "Metric",
    "render_markdown",
    "render_rst",
]
