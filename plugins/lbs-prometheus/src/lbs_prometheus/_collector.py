"""One collector per registry: every registered client's numbers, read when Prometheus scrapes.

A client counts what it does itself (:attr:`lbs.Client.stats`, plain
integers, and :attr:`lbs.Client.metrics`, whose ``series`` keeps each
metric event by label values). Nothing here runs per assignment: the plugin
registers a started client (a weak reference, so a client dropped by the
application disappears from the scrape), and :meth:`LbsCollector.collect`
turns what the clients counted into metric families on the scraping
thread. The few numbers no client keeps (the streams heartbeat ticks kept
or lost and their round trips, reader terminations, running or not) the plugin keeps in a
:class:`ClientRecord` from hooks called once per tick or per lifetime.

Two checks read the same records: :meth:`LbsCollector.readiness` (can the
clients work: heartbeats recent, readers reading) and
:meth:`LbsCollector.liveness` (is the process alive: each running client's
event loop runs a callback the checking thread schedules on it).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

import lbs
from lbs.metrics import BASE_LABELS, METRICS, Metric
from lbs.plugins import MetricValues

from ._liveness import liveness

log = logging.getLogger("lbs_prometheus")

#: Every family name starts with this.
PREFIX: Final = "lbs_"

#: The families read from each client besides :data:`lbs.metrics.METRICS`'s
#: (named ``lbs_<name>``; labels ``service``, ``consumer``, then their own).
OWN: Final[tuple[Metric, ...]] = (
    Metric(
        "locks_acquired_total",
        "counter",
        "Assignments the reader took, held under the consumer's lease (streams handed to the "
        "application).",
    ),
    Metric(
        "locks_released_total",
        "counter",
        "Assignments finished by done_stream(s) or a returning run() handler, by outcome "
        "(DONE, LOCK_LOST: the lease they were read under had lapsed, or they were handed on; "
        "LOCK_EXPIRED is no longer produced and stays 0).",
        ("status",),
    ),
    Metric(
        "streams_handed_back_total",
        "counter",
        "Held streams handed back to the LBS: hand_back(), a failed or timed-out run() handler, shutdown.",
    ),
    Metric(
        "streams_dead_lettered_total",
        "counter",
        "Assignments sent to the dead-letter stream (or dropped without one): malformed, or out of retries.",
    ),
    Metric(
        "streams_disowned_total",
        "counter",
        "Held streams a heartbeat tick found lost with the consumer's lease.",
    ),
    Metric(
        "handler_failures_total",
        "counter",
        "run() handlers that raised (or were cancelled by someone else).",
    ),
    Metric(
        "handler_timeouts_total",
        "counter",
        "run() handlers cancelled for running past their timeout.",
    ),
    Metric(
        "handler_seconds",
        "histogram",
        "How long run() handlers ran, whether they returned or raised.",
    ),
    Metric(
        "retries_delayed_total",
        "counter",
        "Failed streams parked to come back after their retry delay (Config.retry_delay).",
    ),
    Metric("heartbeat_ticks_total", "counter", "Heartbeat ticks that went through."),
    Metric(
        "heartbeat_age_seconds",
        "gauge",
        "Seconds since the last heartbeat tick went through (since the client started, before the first).",
    ),
    Metric(
        "heartbeat_locks_extended_total",
        "counter",
        "Held streams kept by heartbeat ticks: each tick that extends the lease adds the streams it "
        "held (less those lost).",
    ),
    Metric(
        "heartbeat_locks_lost_total",
        "counter",
        "Held streams heartbeat ticks found lost with the consumer's lease.",
    ),
    Metric(
        "heartbeat_tick_seconds",
        "histogram",
        "Round-trip time of one heartbeat tick while streams were held (one key, the lease, however "
        "many).",
    ),
    Metric("held_streams", "gauge", "Data streams the client holds, at scrape time."),
    Metric("client_running", "gauge", "1 between the client's start and close, then 0."),
    Metric(
        "reader_terminations_total",
        "counter",
        "Readers that gave up after Config.read_max_retries failed reads in a row.",
    ),
)
_OWN_BY_NAME: Final = {m.name: m for m in OWN}
_NAME_OK = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


def _stem(name: str) -> str:
    """A family's name as prometheus_client keeps it (a counter's without ``_total``)."""
    return name.removesuffix("_total")


#: Family names (as stems) this collector makes from clients: a foreign name may not take one.
RESERVED: Final[frozenset[str]] = frozenset(_stem(PREFIX + n) for n in (*_OWN_BY_NAME, *METRICS))


class Buckets(Protocol):
    """What a histogram value offers: ``lbs`` client stats' and series' histograms, and :class:`TickSeconds`."""

    @property
    def sum(self) -> float: ...

    def cumulative(self) -> list[tuple[float, int]]: ...


Value = float | Buckets


class TickSeconds:
    """Heartbeat tick round trips in prometheus_client's default buckets (one ``bisect`` an observation)."""

    BOUNDS: Final = tuple(b for b in Histogram.DEFAULT_BUCKETS if b != math.inf)
    __slots__ = ("per_bucket", "sum")

    def __init__(self) -> None:
        self.per_bucket = [0] * (len(self.BOUNDS) + 1)  # not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.per_bucket[bisect.bisect_left(self.BOUNDS, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        return list(zip((*self.BOUNDS, math.inf), itertools.accumulate(self.per_bucket)))


@dataclass(eq=False)
class ClientRecord:
    """What the plugin keeps of one client (everything else is read from the client)."""

    #: The plugin whose hooks write this record (one per client and registry).
    owner: object
    #: ``(service, consumer)``.
    labels: tuple[str, str]
    #: ``time.monotonic()`` at the last ``lbs_client_started``.
    started_at: float
    running: bool = True
    reader_terminations: int = 0
    locks_extended: int = 0
    locks_lost: int = 0
    tick_seconds: TickSeconds = field(default_factory=TickSeconds)
    #: The event loop ``lbs_client_started`` ran on (a weak reference), and its thread's
    #: (ident, name): what :meth:`LbsCollector.liveness` probes. None when started off a loop.
    loop: Callable[[], asyncio.AbstractEventLoop | None] | None = None
    thread: tuple[int, str] | None = None


def _read(
    client: lbs.Client, rec: ClientRecord, now: float
) -> Iterator[tuple[str, tuple[str, ...], Value]]:
    """One client's :data:`OWN` samples: (name, label values beyond service and consumer, value)."""
    st = client.stats
    yield "locks_acquired_total", (), st.taken
    yield "locks_released_total", ("DONE",), st.done
    yield "locks_released_total", ("LOCK_EXPIRED",), st.lock_expired
    yield "locks_released_total", ("LOCK_LOST",), st.lock_lost
    yield "streams_handed_back_total", (), st.handed_back
    yield "streams_dead_lettered_total", (), st.dead_lettered
    yield "streams_disowned_total", (), rec.locks_lost
    yield "handler_failures_total", (), st.handler_failures
    yield "handler_timeouts_total", (), st.handler_timeouts
    yield "handler_seconds", (), st.handler_seconds
    yield "retries_delayed_total", (), st.retries_delayed
    yield "heartbeat_ticks_total", (), st.heartbeats
    yield "heartbeat_age_seconds", (), heartbeat_age(client, rec, now)
    yield "heartbeat_locks_extended_total", (), rec.locks_extended
    yield "heartbeat_locks_lost_total", (), rec.locks_lost
    yield "heartbeat_tick_seconds", (), rec.tick_seconds
    yield "held_streams", (), client.held
    yield "client_running", (), 1 if rec.running else 0
    yield "reader_terminations_total", (), rec.reader_terminations


def heartbeat_age(client: lbs.Client, rec: ClientRecord, now: float) -> float:
    """Seconds since the client's last heartbeat went through, or since it started if none has yet."""
    return max(0.0, now - max(client.stats.heartbeat_at, rec.started_at))


_Family = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily
#: A bucket's ``le`` label, written as prometheus_client's own histograms write it ("0.25", "+Inf").
_le: Callable[[float], str] = floatToGoString  # (untyped upstream)


def _new_family(m: Metric) -> _Family:
    name, labels = PREFIX + m.name, [*BASE_LABELS, *m.labels]
    if m.kind == "counter":
        return CounterMetricFamily(name, m.help, labels=labels)
    if m.kind == "gauge":
        return GaugeMetricFamily(name, m.help, labels=labels)
    return HistogramMetricFamily(name, m.help, labels=labels)


def _add(family: _Family, labels: list[str], value: Value) -> None:
    """One sample (a histogram's buckets, sum and count) into ``family``."""
    if isinstance(value, (int, float)):
        if not isinstance(family, HistogramMetricFamily):
            family.add_metric(labels, value)
    elif isinstance(family, HistogramMetricFamily):
        # The count is the +Inf bucket: consistent with the buckets whatever an
        # observation on the event loop did meanwhile (sum may be one ahead).
        family.add_metric(labels, [(_le(b), n) for b, n in value.cumulative()], value.sum)


class _Foreign:
    """Families of names lbs does not keep (another plugin's, through ``lbs_metric``), made on first sight.

    Plain prometheus_client metrics that belong to no registry: the collector
    yields what they collect.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: name -> (kind, metric, label names)
        self.by_name: dict[str, tuple[str, Counter | Gauge | Histogram, tuple[str, ...]]] = {}

    def family(
        self, name: str, kind: str, label_names: tuple[str, ...]
    ) -> tuple[str, Counter | Gauge | Histogram, tuple[str, ...]]:
        """(kind, metric, label names) for ``name``, created on first use; ValueError on a misfit."""
        found = self.by_name.get(name)
        if found is None:
            with self.lock:
                found = self.by_name.get(name)
                if found is None:
                    found = self.by_name[name] = _foreign_family(name, kind, label_names)
        if found[0] != kind:
            raise ValueError(f"lbs_metric {name!r} is a {found[0]}, reported as a {kind}")
        return found

    def collect(self) -> Iterator[Family]:
        with self.lock:
            metrics = [metric for _, metric, _ in self.by_name.values()]
        for metric in metrics:
            yield from metric.collect()


def _foreign_family(
    name: str, kind: str, label_names: tuple[str, ...]
) -> tuple[str, Counter | Gauge | Histogram, tuple[str, ...]]:
    if name in METRICS:
        raise ValueError(f"{name!r} is one of lbs's metrics, read from its clients at scrape time")
    full = PREFIX + name
    if not _NAME_OK.match(full):
        raise ValueError(f"lbs_metric name {name!r} is not a valid Prometheus name")
    if _stem(full) in RESERVED:
        raise ValueError(
            f"lbs_metric name {name!r} collides with one of lbs_prometheus's own families"
        )
    doc = f"lbs metric {name} (reported through the lbs_metric hook)."
    metric: Counter | Gauge | Histogram
    if kind == "counter":
        metric = Counter(full, doc, label_names, registry=None)
    elif kind == "gauge":
        metric = Gauge(full, doc, label_names, registry=None)
    elif kind == "histogram":
        metric = Histogram(full, doc, label_names, registry=None)
    else:
        raise ValueError(f"lbs_metric {name!r} has unknown kind {kind!r}")
    return kind, metric, label_names


class LbsCollector(Collector):
    """Every client registered on one registry, read at scrape time (:func:`collector_for` gives it).

    Families: :data:`OWN` and, for each name of :data:`lbs.metrics.METRICS`
    some client reported, ``lbs_<name>`` with the table's kind, help and
    labels; then the foreign names :meth:`record` was given.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[lbs.Client, ClientRecord] = (
            weakref.WeakKeyDictionary()
        )
        self._foreign = _Foreign()
        self._warned: set[str] = set()

    # ------------------------------------------------------------ clients ---

    def started(self, client: lbs.Client, owner: object) -> ClientRecord:
        """Register ``client`` (again) as running, its hooks written by ``owner``; its record."""
        now = time.monotonic()
        with self._lock:
            rec = self._clients.get(client)
            if rec is None:
                rec = self._clients[client] = ClientRecord(
                    owner, (str(client.service), str(client.id)), now
                )
            rec.running, rec.started_at = True, now
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # started off an event loop: liveness cannot probe it
                rec.loop, rec.thread = None, None
            else:
                thread = threading.current_thread()
                rec.loop, rec.thread = _ref(loop), (threading.get_ident(), thread.name)
            return rec

    def record_of(self, client: lbs.Client, owner: object) -> ClientRecord | None:
        """``client``'s record if ``owner`` writes it (else None: not registered, or another plugin's)."""
        rec = self._clients.get(client)
        return rec if rec is not None and rec.owner is owner else None

    def clients(self) -> list[tuple[lbs.Client, ClientRecord]]:
        """A snapshot of the registered clients (those still alive)."""
        with self._lock:
            return list(self._clients.items())

    # ------------------------------------------------------------- scrape ---

    def describe(self) -> Iterable[Family]:
        # What the registry checks for name clashes when this collector is registered.
        for m in (*OWN, *METRICS.values()):
            yield _new_family(m)

    def collect(self) -> Iterator[Family]:
        now = time.monotonic()
        own = {m.name: _new_family(m) for m in OWN}
        table: dict[str, _Family] = {}
        for client, rec in self.clients():
            base = list(rec.labels)
            for name, extra, value in _read(client, rec, now):
                _add(own[name], [*base, *extra], value)
            values = client.metrics
            if not isinstance(values, MetricValues):
                continue  # an lbs without series: only its stats are read
            for name, series in values.series.copy().items():
                m = METRICS.get(name)
                if m is None:
                    continue
                family = table.get(name)
                if family is None:
                    family = table[name] = _new_family(m)
                for key, value in series.copy().items():
                    _add(family, [*base, *key], value)
        yield from own.values()
        yield from table.values()
        yield from self._foreign.collect()

    # ------------------------------------------------------------ foreign ---

    def record(self, name: str, kind: str, value: float, labels: Mapping[str, str]) -> None:
        """Record an event of a name lbs does not keep itself (see :meth:`PrometheusPlugin.record`)."""
        try:
            _, metric, names = self._foreign.family(name, kind, tuple(labels))
        except ValueError as exc:
            self._warn_once("bad:" + name, "%s; not recorded", exc)
            return
        if tuple(labels) != names and set(labels) != set(names):
            self._warn_once(
                "labels:" + name,
                "lbs_metric %r came with labels %s, its family has %s",
                name,
                sorted(labels),
                list(names),
            )
        child: Any = metric.labels(*(str(labels.get(n, "")) for n in names)) if names else metric
        try:
            if kind == "counter":
                child.inc(value)
            elif kind == "gauge":
                child.set(value)
            else:
                child.observe(value)
        except ValueError as exc:  # a negative counter increment
            self._warn_once("value:" + name, "lbs_metric %r: %s; not recorded", name, exc)

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("lbs_prometheus: " + msg, *args)  # noqa: G003 (msg is a %-format for args)

    # ------------------------------------------------------------- health ---

    def readiness(self, now: float | None = None) -> tuple[bool, dict[str, Any]]:
        """Whether every running client can work, and the body ``/readyz`` (and ``/healthz``) answers with.

        Ready: at least one client runs, and each running one's last
        heartbeat went through less than 2 x its ``Config.heartbeat_every``
        ago (counted from its start before the first) and its reader has not
        given up. Redis unreachable (or stalled) stops the heartbeat: not
        ready until it answers again. Closed clients are listed, not judged.
        """
        now = time.monotonic() if now is None else now
        listed, unhealthy = [], []
        for client, rec in self.clients():
            service, consumer = rec.labels
            entry: dict[str, Any] = {"service": service, "consumer": consumer}
            if not rec.running:
                entry["state"] = "closed"
                listed.append(entry)
                continue
            age, limit = heartbeat_age(client, rec, now), 2 * client.config.heartbeat_every
            entry.update(state="running", heartbeat_age=round(age, 3))
            listed.append(entry)
            if age >= limit:
                unhealthy.append(
                    {
                        "service": service,
                        "consumer": consumer,
                        "reason": f"no heartbeat for {age:.1f}s (limit {limit:g}s)",
                    }
                )
            elif rec.reader_terminations:
                unhealthy.append(
                    {"service": service, "consumer": consumer, "reason": "its reader gave up"}
                )
        ok = not unhealthy and any(e["state"] == "running" for e in listed)
        body: dict[str, Any] = {"status": "ok" if ok else "unhealthy", "clients": listed}
        if not ok:
            body["unhealthy"] = unhealthy if unhealthy else [{"reason": "no lbs client is running"}]
        return ok, body

    #: The old name of :meth:`readiness` (``/healthz`` answers what ``/readyz`` does).
    health = readiness

    def liveness(self, timeout: float) -> tuple[bool, dict[str, Any]]:
        """Whether the process is alive, and the body ``/livez`` answers with (:func:`._liveness.liveness`)."""
        return liveness(self.clients(), timeout)


def _ref(loop: asyncio.AbstractEventLoop) -> Callable[[], asyncio.AbstractEventLoop | None]:
    """A weak reference to ``loop`` (the record must not keep a dropped loop, and what it holds,
    alive); a strong one for a loop type that takes no weak reference."""
    try:
        return weakref.ref(loop)
    except TypeError:
        return lambda: loop


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, LbsCollector] = (
    weakref.WeakKeyDictionary()
)
_collectors_lock = threading.Lock()


def collector_for(registry: CollectorRegistry) -> LbsCollector:
    """The registry's one :class:`LbsCollector`, created and registered on first use."""
    with _collectors_lock:
        found = _collectors.get(registry)
        if found is None:
            found = _collectors[registry] = LbsCollector()
            registry.register(found)
        return found
