"""The plugin: registers started clients with the registry's collector, and serves it.

No hook here runs per assignment. ``lbs_client_started`` registers the
client with :class:`~lbs_prometheus._collector.LbsCollector`, which reads
its counters when Prometheus scrapes; the other hooks are called once per
heartbeat tick (``lbs_locks_extended``), once per client lifetime, or for a
metric name lbs does not keep itself (``lbs_metric``, another plugin's).
Nothing here raises into the client: every hook catches and logs (once per
problem).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from prometheus_client import REGISTRY, CollectorRegistry

import lbs
from lbs.metrics import METRICS
from lbs.plugins import worker_slot

from ._collector import ClientRecord, collector_for
from ._http import LIVE_TIMEOUT, checked_live_timeout, start_server, stop_server

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger("lbs_prometheus")

#: Environment variables read by the auto-loaded plugin (:data:`default_plugin`).
PORT_ENV: Final = "LBS_PROMETHEUS_PORT"
ADDR_ENV: Final = "LBS_PROMETHEUS_ADDR"
LIVE_TIMEOUT_ENV: Final = "LBS_PROMETHEUS_LIVE_TIMEOUT"
DEFAULT_ADDR: Final = "127.0.0.1"


class PrometheusPlugin:
    """Exports what :class:`lbs.Client` counts through a prometheus_client registry.

    Pass it in ``lbs.Client(..., plugins=[PrometheusPlugin(...)])``; the same
    instance may serve many clients. ``registry`` defaults to
    prometheus_client's ``REGISTRY``. With ``port`` (0 picks a free one) it
    also serves ``http://<addr>:<port>/metrics``, ``/livez``, ``/readyz`` and
    ``/healthz`` (:func:`~lbs_prometheus.make_app`; ``/livez`` waits up to
    ``live_timeout`` seconds for each event loop, a number > 0 or
    :class:`lbs.ConfigurationError`) from a daemon thread, started here;
    :attr:`port` is the bound port (None when not serving). The server stops
    when the last client using the plugin closes (and starts again, on the
    same port, with the next client that starts), or on :meth:`close`. A
    bind failure is logged, not raised.

    An explicit instance in a client's ``plugins`` replaces the auto-loaded
    :data:`default_plugin` for that client, so nothing is counted twice.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        addr: str = DEFAULT_ADDR,
        registry: CollectorRegistry | None = None,
        live_timeout: float = LIVE_TIMEOUT,
    ) -> None:
        self.registry: CollectorRegistry = REGISTRY if registry is None else registry
        self.addr = addr
        self.live_timeout = checked_live_timeout(live_timeout)
        self.collector = collector_for(self.registry)
        self._running: weakref.WeakSet[lbs.Client] = weakref.WeakSet()
        self._warned: set[str] = set()
        self._server_lock = threading.Lock()
        self._server: WSGIServer | None = None
        self._stopping: threading.Thread | None = None
        self._closed = False
        self._want_port = port
        if port is not None:
            self._server = start_server(port, addr, self.registry, self.live_timeout)
            if self._server is not None:
                self._want_port = (
                    self._server.server_port
                )  # a restart reuses the port picked for port=0

    # ------------------------------------------------------------ server ---

    @property
    def port(self) -> int | None:
        """The port ``/metrics`` and the health checks are served on now, or None."""
        server = self._server
        return None if server is None else int(server.server_port)

    def close(self) -> None:
        """Stop the HTTP server (if any) and wait until its port is free; recording goes on. Idempotent."""
        with self._server_lock:
            self._closed = True
            server, self._server = self._server, None
            stopping, self._stopping = self._stopping, None
        if server is not None:
            stop_server(server)
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
            self._server = start_server(
                self._want_port, self.addr, self.registry, self.live_timeout
            )

    def _stop_in_background(self) -> None:
        """The last client closed: stop serving without blocking its event loop."""
        with self._server_lock:
            server, self._server = self._server, None
            if server is None:
                return
            self._stopping = threading.Thread(
                target=stop_server, args=(server,), daemon=True, name="lbs-prometheus-stop"
            )
            self._stopping.start()

    # ------------------------------------------------------------ clients ---

    def _takes_part(self, client: lbs.Client) -> bool:
        return True

    def _record(self, client: lbs.Client) -> ClientRecord | None:
        return self.collector.record_of(client, self)

    def _failed(self, hook: str) -> None:
        if hook not in self._warned:
            self._warned.add(hook)
            # Called from the hooks' except blocks only.
            log.exception("lbs_prometheus: hook %s failed (logged once)", hook)  # noqa: LOG004

    # --------------------------------------------------------------- hooks ---

    @lbs.hookimpl
    def lbs_client_started(self, client: lbs.Client) -> None:
        try:
            if not self._takes_part(client):
                return
            self.collector.started(client, self)
            self._running.add(client)
            self._serve_again()
        except Exception:
            self._failed("lbs_client_started")

    @lbs.hookimpl
    def lbs_client_closed(self, client: lbs.Client) -> None:
        try:
            rec = self._record(client)
            if rec is None:
                return
            rec.running = False
            self._running.discard(client)
            if not self._running:
                self._stop_in_background()
        except Exception:
            self._failed("lbs_client_closed")

    @lbs.hookimpl
    def lbs_reader_terminated(self, client: lbs.Client) -> None:
        try:
            rec = self._record(client)
            if rec is not None:
                rec.reader_terminations += 1
        except Exception:
            self._failed("lbs_reader_terminated")

    @lbs.hookimpl
    def lbs_locks_extended(
        self, client: lbs.Client, extended: int, lost: int, seconds: float
    ) -> None:
        try:
            rec = self._record(client)
            if rec is not None:
                rec.locks_extended += extended
                rec.locks_lost += lost
                rec.tick_seconds.observe(seconds)
        except Exception:
            self._failed("lbs_locks_extended")

    @lbs.hookimpl
    def lbs_worker_banner(self, client: lbs.Client) -> dict[str, str] | None:
        try:
            if not self._takes_part(client):
                return None
            return self._describe()
        except Exception:
            self._failed("lbs_worker_banner")
            return None

    def _describe(self) -> dict[str, str] | None:
        port = self.port
        if port is None:
            return None
        return {"metrics": f"http://{self.addr}:{port}/metrics, /livez and /readyz"}

    @lbs.hookimpl
    def lbs_process_info(self, client: lbs.Client) -> dict[str, str] | None:
        """This process's own ``/metrics`` URL for the journal (``lbs dashboard`` reads it)."""
        try:
            port = self.port if self._takes_part(client) else None
            return None if port is None else {"metrics": metrics_url(self._bound_addr(), port)}
        except Exception:
            self._failed("lbs_process_info")
            return None

    def _bound_addr(self) -> str:
        return self.addr

    @lbs.hookimpl
    def lbs_metric(
        self, client: lbs.Client, name: str, kind: str, value: float, labels: Mapping[str, str]
    ) -> None:
        if name in METRICS:
            return  # lbs keeps it (client.metrics): read at scrape time
        try:
            if self._takes_part(client):
                self.record(name, kind, value, labels)
        except Exception:
            self._failed("lbs_metric")

    def record(self, name: str, kind: str, value: float, labels: Mapping[str, str]) -> None:
        """Record one ``lbs_metric`` event of a name lbs does not keep itself (what the hook does).

        lbs's own names (:data:`lbs.metrics.METRICS`) are read from the
        clients at scrape time and refused here. Any other (a third-party
        plugin's) becomes the family ``lbs_<name>``, created the first time
        the name is seen with that event's kind and label names and a
        generic help text: ``counter`` -> ``Counter.inc(value)``, ``gauge``
        -> ``Gauge.set(value)``, ``histogram`` -> ``Histogram.observe(value)``.
        An event with other label names is recorded on the family's (missing
        values empty) and logged once; an event whose kind is not the
        family's, a name that cannot be a family (bad characters, unknown
        kind, one of this plugin's names) or a value the family refuses (a
        negative increment) is logged once and skipped. Never raises.
        """
        self.collector.record(name, kind, value, labels)


class _EnvPlugin(PrometheusPlugin):
    """The auto-loaded instance: the default registry, and a server only if LBS_PROMETHEUS_PORT says so."""

    def __init__(self) -> None:
        super().__init__()

    def _takes_part(self, client: lbs.Client) -> bool:
        # An explicit PrometheusPlugin in this client's plugins replaces us.
        return not any(
            isinstance(p, PrometheusPlugin) and p is not self for p in client.pm.get_plugins()
        )

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

    def _bound_addr(self) -> str:
        return env_addr()

    def _describe(self) -> dict[str, str] | None:
        port, slot = self.port, worker_slot()
        if port is None:
            return None
        addr = env_addr()
        if slot is None or slot[1] == 1:
            return {"metrics": f"http://{addr}:{port}/metrics, /livez and /readyz"}
        if env_port() == 0:
            return {
                "metrics": f"http://{addr}:{port}/metrics, /livez and /readyz for this process; the others on "
                f"free ports of their own ({PORT_ENV}=0: each logs its own)"
            }
        base = port - slot[0]
        return {
            "metrics": f"http://{addr}:{base}/metrics … :{base + slot[1] - 1}/metrics, /livez and /readyz, "
            f"one port per worker process ({PORT_ENV} + slot)"
        }


def metrics_url(addr: str, port: int) -> str:
    """``http://HOST:PORT/metrics``; a wildcard address (all interfaces) names this host as others
    reach it: ``$POD_IP`` on Kubernetes, else the host name."""
    if addr in ("", "0.0.0.0", "::"):
        addr = os.environ.get("POD_IP") or socket.gethostname()
    host = f"[{addr}]" if ":" in addr else addr
    return f"http://{host}:{port}/metrics"


_env_lock = threading.Lock()
_env_tried = False
_env_server: WSGIServer | None = None


def env_port() -> int | None:
    """The port ``LBS_PROMETHEUS_PORT`` asks this process to serve on: in worker process ``slot`` of
    ``lbs worker --processes N`` the variable's port + slot (one port per process; 0 stays 0: each picks
    a free one). None when unset or not a port number (logged)."""
    raw = os.environ.get(PORT_ENV, "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        log.error("lbs_prometheus: %s=%r is not a port number; not serving", PORT_ENV, raw)
        return None
    slot = worker_slot()
    return port + slot[0] if slot is not None and port else port


def env_addr() -> str:
    """The address ``LBS_PROMETHEUS_ADDR`` asks to serve on (default 127.0.0.1)."""
    return os.environ.get(ADDR_ENV, "").strip() or DEFAULT_ADDR


def env_live_timeout() -> float:
    """How long ``/livez`` waits for each event loop: ``LBS_PROMETHEUS_LIVE_TIMEOUT`` seconds, else (unset,
    or not a number > 0: logged) :data:`~lbs_prometheus.LIVE_TIMEOUT`."""
    raw = os.environ.get(LIVE_TIMEOUT_ENV, "").strip()
    if not raw:
        return LIVE_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        log.error(
            "lbs_prometheus: %s=%r is not a number of seconds > 0; /livez waits %gs",
            LIVE_TIMEOUT_ENV,
            raw,
            LIVE_TIMEOUT,
        )
        return LIVE_TIMEOUT
    return seconds


def serve_from_env(registry: CollectorRegistry | None = None) -> int | None:
    """Start the process-wide ``/metrics``, ``/livez``, ``/readyz`` and ``/healthz`` server if
    ``LBS_PROMETHEUS_PORT`` is set (once; ``/livez``'s bound from ``LBS_PROMETHEUS_LIVE_TIMEOUT``).

    The auto-loaded plugin calls this when a client starts. Returns the bound
    port, or None (variable unset, unusable, or the bind failed: logged).
    """
    global _env_tried, _env_server  # noqa: PLW0603 (one server per process, started once)
    if _env_tried:
        return None if _env_server is None else int(_env_server.server_port)
    with _env_lock:
        if not _env_tried:
            port = env_port()
            if port is not None:
                _env_server = start_server(
                    port,
                    env_addr(),
                    REGISTRY if registry is None else registry,
                    env_live_timeout(),
                )
            _env_tried = True
    return None if _env_server is None else int(_env_server.server_port)


#: The instance published under the entry-point group ``lbs`` as ``prometheus``:
#: exports into ``REGISTRY``; serves only when ``LBS_PROMETHEUS_PORT`` is set.
default_plugin: Final[PrometheusPlugin] = _EnvPlugin()
