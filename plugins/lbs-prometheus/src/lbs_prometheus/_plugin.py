"""The plugin: lbs hooks -> prometheus_client metric families.

Hooks run on the client's event loop, so each one is a dictionary look-up and
an ``inc()``/``set()``/``observe()`` on a child bound once per client. Nothing
here raises into the client: every hook catches and logs (once per problem).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import lbs
from lbs.metrics import BASE_LABELS, METRICS
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger("lbs_prometheus")

#: Environment variables read by the auto-loaded plugin (:data:`default_plugin`).
PORT_ENV: Final = "LBS_PROMETHEUS_PORT"
ADDR_ENV: Final = "LBS_PROMETHEUS_ADDR"
DEFAULT_ADDR: Final = "127.0.0.1"

#: Every metric name starts with this.
PREFIX: Final = "lbs_"
_BASE_LABELS: Final = BASE_LABELS
_NAME_OK = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


class _Families:
    """The metric families of one registry, shared by every plugin on it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        labels = _BASE_LABELS
        kw: dict[str, Any] = {"registry": registry}
        # Counter appends "_total" itself: lbs_locks_acquired -> lbs_locks_acquired_total.
        self.acquired = Counter(PREFIX + "locks_acquired", "Assignment locks taken by the reader.", labels, **kw)
        self.released = Counter(PREFIX + "locks_released", "Assignments finished by done_stream, by outcome "
                                "(DONE, LOCK_EXPIRED, LOCK_LOST).", (*labels, "status"), **kw)
        self.disowned = Counter(PREFIX + "streams_disowned", "Held streams whose lock the heartbeat found "
                                "no longer ours.", labels, **kw)
        self.handed_back = Counter(PREFIX + "streams_handed_back", "Held streams handed back to the LBS as a "
                                   "fresh entry (retry_counted: their retry count went up).",
                                   (*labels, "retry_counted"), **kw)
        self.dead_lettered = Counter(PREFIX + "streams_dead_lettered", "Entries sent to the dead-letter stream "
                                     "(or dropped): malformed, or out of retries.", labels, **kw)
        self.ticks = Counter(PREFIX + "heartbeat_ticks", "Heartbeat ticks (ticks with at least one lock held).",
                             labels, **kw)
        self.extended = Counter(PREFIX + "heartbeat_locks_extended", "Locks extended by heartbeat ticks.",
                                labels, **kw)
        self.lost = Counter(PREFIX + "heartbeat_locks_lost", "Locks heartbeat ticks found no longer ours.",
                            labels, **kw)
        self.tick_seconds = Histogram(PREFIX + "heartbeat_tick_seconds", "Round-trip time of one heartbeat tick.",
                                      labels, **kw)
        self.held = Gauge(PREFIX + "held_streams", "Data streams held by the client now.", labels, **kw)
        self.running = Gauge(PREFIX + "client_running", "1 between a client's start and close, else 0.",
                             labels, **kw)
        self.terminated = Counter(PREFIX + "reader_terminations", "Readers that gave up after "
                                  "Config.read_max_retries failed reads in a row.", labels, **kw)
        self.fixed_names = {PREFIX + n for n in (
            "locks_acquired_total", "locks_released_total", "streams_disowned_total", "streams_handed_back_total",
            "streams_dead_lettered_total", "heartbeat_ticks_total", "heartbeat_locks_extended_total",
            "heartbeat_locks_lost_total", "heartbeat_tick_seconds", "held_streams", "client_running",
            "reader_terminations_total")}
        # lbs_metric families, created the first time a name is seen: name -> (kind, family, label names).
        # A name in lbs.metrics.METRICS takes the table's kind, labels and help; any other, its first event's.
        self.generic: dict[str, tuple[str, Counter | Gauge | Histogram, tuple[str, ...]]] = {}
        self.lock = threading.Lock()

    def family(self, name: str, kind: str,
               label_names: tuple[str, ...]) -> tuple[str, Counter | Gauge | Histogram, tuple[str, ...]]:
        """(kind, family, label names) for ``name``, created on first use; ValueError on a misfit."""
        found = self.generic.get(name)
        if found is None:
            with self.lock:
                found = self.generic.get(name)
                if found is None:
                    found = self.generic[name] = self._create(name, kind, label_names)
        if found[0] != kind:
            raise ValueError(f"lbs_metric {name!r} is a {found[0]}, reported as a {kind}")
        return found

    def _create(self, name: str, kind: str,
                label_names: tuple[str, ...]) -> tuple[str, Counter | Gauge | Histogram, tuple[str, ...]]:
        known = METRICS.get(name)
        if known is not None:
            kind, label_names, doc = known.kind, (*_BASE_LABELS, *known.labels), known.help
        else:
            doc = f"lbs metric {name} (reported through the lbs_metric hook)."
        full = PREFIX + name
        if not _NAME_OK.match(full):
            raise ValueError(f"lbs_metric name {name!r} is not a valid Prometheus name")
        if full in self.fixed_names or (kind == "counter" and full + "_total" in self.fixed_names):
            raise ValueError(f"lbs_metric name {name!r} collides with one of lbs_prometheus's own metrics")
        family: Counter | Gauge | Histogram
        if kind == "counter":
            family = Counter(full, doc, label_names, registry=self.registry)
        elif kind == "gauge":
            family = Gauge(full, doc, label_names, registry=self.registry)
        elif kind == "histogram":
            family = Histogram(full, doc, label_names, registry=self.registry)
        else:
            raise ValueError(f"lbs_metric {name!r} has unknown kind {kind!r}")
        return kind, family, label_names


_families_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_families_lock = threading.Lock()


def _families_for(registry: CollectorRegistry) -> _Families:
    with _families_lock:
        fam = _families_by_registry.get(registry)
        if fam is None:
            fam = _families_by_registry[registry] = _Families(registry)
        return fam


class _Bound:
    """One client's children of the fixed families (label values bound once)."""

    def __init__(self, fam: _Families, service: str, consumer: str) -> None:
        self.fam, self.labels = fam, (service, consumer)
        self.acquired = fam.acquired.labels(service, consumer)
        self.disowned = fam.disowned.labels(service, consumer)
        self.dead_lettered = fam.dead_lettered.labels(service, consumer)
        self.ticks = fam.ticks.labels(service, consumer)
        self.extended = fam.extended.labels(service, consumer)
        self.lost = fam.lost.labels(service, consumer)
        self.tick_seconds = fam.tick_seconds.labels(service, consumer)
        self.held = fam.held.labels(service, consumer)
        self.running = fam.running.labels(service, consumer)
        self.terminated = fam.terminated.labels(service, consumer)
        self._released: dict[str, Counter] = {}
        self._handed_back: dict[bool, Counter] = {}

    def released(self, status: str) -> Counter:
        child = self._released.get(status)
        if child is None:
            child = self._released[status] = self.fam.released.labels(*self.labels, status)
        return child

    def handed_back(self, retry_counted: bool) -> Counter:
        child = self._handed_back.get(retry_counted)
        if child is None:
            child = self._handed_back[retry_counted] = self.fam.handed_back.labels(
                *self.labels, "true" if retry_counted else "false")
        return child


def _start_server(port: int, addr: str, registry: CollectorRegistry) -> WSGIServer | None:
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except Exception as exc:  # OSError (in use, bad address), gaierror...: log, never raise into lbs
        log.error("lbs_prometheus: cannot serve /metrics on %s:%s: %s", addr, port, exc)
        return None
    log.info("lbs_prometheus: serving /metrics on http://%s:%d/metrics", addr, server.server_port)
    return server


def _stop_server(server: WSGIServer) -> None:
    server.shutdown()  # waits for serve_forever's next poll (up to 0.5 s)
    server.server_close()


class PrometheusPlugin:
    """Records what :class:`lbs.Client` hooks report into a prometheus_client registry.

    Pass it in ``lbs.Client(..., plugins=[PrometheusPlugin(...)])``; the same
    instance may serve many clients. ``registry`` defaults to
    prometheus_client's ``REGISTRY``. With ``port`` (0 picks a free one) it
    also serves ``http://<addr>:<port>/metrics`` from a daemon thread, started
    here; :attr:`port` is the bound port (None when not serving). The server
    stops when the last client using the plugin closes (and starts again,
    on the same port, with the next client that starts), or on :meth:`close`.
    A bind failure is logged, not raised.

    An explicit instance in a client's ``plugins`` replaces the auto-loaded
    :data:`default_plugin` for that client, so nothing is counted twice.
    """

    def __init__(self, *, port: int | None = None, addr: str = DEFAULT_ADDR,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry: CollectorRegistry = REGISTRY if registry is None else registry
        self.addr = addr
        self._families = _families_for(self.registry)
        self._clients: weakref.WeakKeyDictionary[lbs.Client, _Bound | None] = weakref.WeakKeyDictionary()
        self._running: weakref.WeakSet[lbs.Client] = weakref.WeakSet()
        self._warned: set[str] = set()
        self._server_lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._stopping: threading.Thread | None = None
        self._closed = False
        self._want_port = port
        if port is not None:
            self._server = _start_server(port, addr, self.registry)
            if self._server is not None:
                self._want_port = self._server.server_port  # a restart reuses the port picked for port=0

    # ------------------------------------------------------------ server ---

    @property
    def port(self) -> int | None:
        """The port ``/metrics`` is served on now, or None."""
        server = self._server
        return None if server is None else int(server.server_port)

    def close(self) -> None:
        """Stop the HTTP server (if any) and wait until its port is free; recording goes on. Idempotent."""
        with self._server_lock:
            self._closed = True
            server, self._server = self._server, None
            stopping, self._stopping = self._stopping, None
        if server is not None:
            _stop_server(server)
        if stopping is not None:
            stopping.join()

    def _serve_again(self) -> None:
        """A client started: bring back a server the last close() of a client stopped."""
        if self._want_port is None or self._closed or self._server is not None:
            return
        with self._server_lock:
            if self._closed or self._server is not None:
                return
            if self._stopping is not None:
                self._stopping.join()  # the old server still holds the port (rare: start right after close)
                self._stopping = None
            self._server = _start_server(self._want_port, self.addr, self.registry)

    def _stop_in_background(self) -> None:
        """The last client closed: stop serving without blocking its event loop."""
        with self._server_lock:
            server, self._server = self._server, None
            if server is None:
                return
            self._stopping = threading.Thread(target=_stop_server, args=(server,), daemon=True,
                                              name="lbs-prometheus-stop")
            self._stopping.start()

    # ------------------------------------------------------------ clients ---

    def _takes_part(self, client: lbs.Client) -> bool:
        return True

    def _bound(self, client: lbs.Client) -> _Bound | None:
        try:
            return self._clients[client]
        except KeyError:
            pass
        bound = _Bound(self._families, str(client.service), str(client.id)) if self._takes_part(client) else None
        self._clients[client] = bound
        return bound

    def _warn_once(self, key: str, msg: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("lbs_prometheus: " + msg, *args)

    def _failed(self, hook: str) -> None:
        if hook not in self._warned:
            self._warned.add(hook)
            log.exception("lbs_prometheus: hook %s failed (logged once)", hook)

    # --------------------------------------------------------------- hooks ---

    @lbs.hookimpl
    def lbs_client_started(self, client: lbs.Client) -> None:
        try:
            b = self._bound(client)
            if b is None:
                return
            self._running.add(client)
            b.running.set(1)
            b.held.set(client.held)
            self._serve_again()
        except Exception:
            self._failed("lbs_client_started")

    @lbs.hookimpl
    def lbs_client_closed(self, client: lbs.Client) -> None:
        try:
            b = self._bound(client)
            if b is None:
                return
            b.running.set(0)
            b.held.set(client.held)
            self._running.discard(client)
            if not self._running:
                self._stop_in_background()
        except Exception:
            self._failed("lbs_client_closed")

    @lbs.hookimpl
    def lbs_reader_terminated(self, client: lbs.Client) -> None:
        try:
            b = self._bound(client)
            if b is not None:
                b.terminated.inc()
        except Exception:
            self._failed("lbs_reader_terminated")

    @lbs.hookimpl
    def lbs_lock_acquired(self, client: lbs.Client) -> None:
        try:
            b = self._bound(client)
            if b is not None:
                b.acquired.inc()
                b.held.set(client.held)
        except Exception:
            self._failed("lbs_lock_acquired")

    @lbs.hookimpl
    def lbs_lock_released(self, client: lbs.Client, status: lbs.DoneStatus) -> None:
        try:
            b = self._bound(client)
            if b is not None:
                b.released(status.name).inc()
                b.held.set(client.held)
        except Exception:
            self._failed("lbs_lock_released")

    @lbs.hookimpl
    def lbs_locks_extended(self, client: lbs.Client, extended: int, lost: int, seconds: float) -> None:
        try:
            b = self._bound(client)
            if b is not None:
                b.ticks.inc()
                b.extended.inc(extended)
                b.lost.inc(lost)
                b.tick_seconds.observe(seconds)
                b.held.set(client.held)
        except Exception:
            self._failed("lbs_locks_extended")

    @lbs.hookimpl
    def lbs_stream_disowned(self, client: lbs.Client) -> None:
        try:
            b = self._bound(client)
            if b is not None:
                b.disowned.inc()
                b.held.set(client.held)
        except Exception:
            self._failed("lbs_stream_disowned")

    @lbs.hookimpl
    def lbs_stream_handed_back(self, client: lbs.Client, retry_counted: bool) -> None:
        try:
            b = self._bound(client)
            if b is not None:
                b.handed_back(bool(retry_counted)).inc()
                b.held.set(client.held)
        except Exception:
            self._failed("lbs_stream_handed_back")

    @lbs.hookimpl
    def lbs_stream_dead_lettered(self, client: lbs.Client) -> None:
        try:
            b = self._bound(client)
            if b is not None:
                b.dead_lettered.inc()
                b.held.set(client.held)
        except Exception:
            self._failed("lbs_stream_dead_lettered")

    @lbs.hookimpl
    def lbs_metric(self, client: lbs.Client, name: str, kind: str, value: float,
                   labels: Mapping[str, str]) -> None:
        try:
            if self._bound(client) is None:
                return
            self.record(name, kind, value, labels)
        except Exception:
            self._failed("lbs_metric")

    def record(self, name: str, kind: str, value: float, labels: Mapping[str, str]) -> None:
        """Map one ``lbs_metric`` event onto the registry (what the hook does).

        ``counter`` -> ``Counter.inc(value)``, ``gauge`` -> ``Gauge.set(value)``,
        ``histogram`` -> ``Histogram.observe(value)``, on the family
        ``lbs_<name>``, created the first time the name is seen. A name in
        :data:`lbs.metrics.METRICS` gets the table's kind, help text and label
        names (``service``, ``consumer``, then its own); any other name (a
        third-party plugin's) its first event's kind and label names, and a
        generic help text. An event with other label names is recorded on the
        family's (missing values empty) and logged once; an event whose kind
        is not the family's, a name that cannot be a family (bad characters,
        unknown kind) or a value the family refuses (a negative increment) is
        logged once and skipped. Never raises.
        """
        try:
            _, family, names = self._families.family(name, kind, tuple(labels))
        except ValueError as exc:
            self._warn_once("bad:" + name, "%s; not recorded", exc)
            return
        if tuple(labels) != names and set(labels) != set(names):
            self._warn_once("labels:" + name, "lbs_metric %r came with labels %s, its family has %s",
                            name, sorted(labels), list(names))
        child: Any = family.labels(*(str(labels.get(n, "")) for n in names)) if names else family
        try:
            if kind == "counter":
                child.inc(value)
            elif kind == "gauge":
                child.set(value)
            else:
                child.observe(value)
        except ValueError as exc:  # a negative counter increment
            self._warn_once("value:" + name, "lbs_metric %r: %s; not recorded", name, exc)


class _EnvPlugin(PrometheusPlugin):
    """The auto-loaded instance: the default registry, and a server only if LBS_PROMETHEUS_PORT says so."""

    def __init__(self) -> None:
        super().__init__()

    def _takes_part(self, client: lbs.Client) -> bool:
        # An explicit PrometheusPlugin in this client's plugins replaces us.
        return not any(isinstance(p, PrometheusPlugin) and p is not self for p in client.pm.get_plugins())

    @property
    def port(self) -> int | None:
        server = _env_server
        return None if server is None else int(server.server_port)

    def close(self) -> None:
        """The process-wide server lives as long as the process; nothing to do."""

    def _serve_again(self) -> None:
        serve_from_env(self.registry)

    def _stop_in_background(self) -> None:
        pass


_env_lock = threading.Lock()
_env_tried = False
_env_server: WSGIServer | None = None


def serve_from_env(registry: CollectorRegistry | None = None) -> int | None:
    """Start the process-wide ``/metrics`` server if ``LBS_PROMETHEUS_PORT`` is set (once per process).

    The auto-loaded plugin calls this when a client starts. Returns the bound
    port, or None (variable unset, unusable, or the bind failed: logged).
    """
    global _env_tried, _env_server
    if _env_tried:
        return None if _env_server is None else int(_env_server.server_port)
    with _env_lock:
        if not _env_tried:
            raw = os.environ.get(PORT_ENV, "").strip()
            if raw:
                try:
                    port = int(raw)
                except ValueError:
                    log.error("lbs_prometheus: %s=%r is not a port number; not serving", PORT_ENV, raw)
                else:
                    addr = os.environ.get(ADDR_ENV, "").strip() or DEFAULT_ADDR
                    _env_server = _start_server(port, addr, REGISTRY if registry is None else registry)
            _env_tried = True
    return None if _env_server is None else int(_env_server.server_port)


#: The instance published under the entry-point group ``lbs`` as ``prometheus``:
#: records into ``REGISTRY``; serves only when ``LBS_PROMETHEUS_PORT`` is set.
default_plugin: Final[PrometheusPlugin] = _EnvPlugin()
