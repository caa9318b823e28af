"""The HTTP side: ``/livez``, ``/readyz`` and ``/healthz`` beside prometheus_client's ``/metrics`` app,
on a wsgiref server thread (one thread per request)."""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from lbs.exceptions import ConfigurationError
from lbs.plugins import worker_slot

from ._collector import collector_for

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("lbs_prometheus")

#: The liveness check: the process's event loops answer (Redis plays no part).
LIVE_PATH = "/livez"
#: The readiness check: the clients can work (heartbeats recent, readers reading).
READY_PATH = "/readyz"
#: The readiness check's first name, kept: it answers what :data:`READY_PATH` does.
HEALTH_PATH = "/healthz"
#: How long ``/livez`` waits for each event loop to run its no-op, in seconds, by default.
LIVE_TIMEOUT = 2.0


def checked_live_timeout(seconds: float) -> float:
    """``seconds`` as ``/livez``'s bound: a finite number > 0, else :class:`lbs.ConfigurationError`."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not 0 < seconds < math.inf
    ):
        raise ConfigurationError(f"live_timeout must be a number of seconds > 0, got {seconds!r}")
    return float(seconds)


def make_app(registry: CollectorRegistry, *, live_timeout: float = LIVE_TIMEOUT) -> WSGIApplication:
    """A WSGI app: ``/livez``, ``/readyz``, ``/healthz`` (the registry's lbs clients) and, on any other
    path, ``/metrics``.

    ``/livez`` answers 200 while every running client's event loop runs a
    no-op within ``live_timeout`` seconds (and no reader gave up), else 503
    naming the dead ones (:meth:`LbsCollector.liveness`); Redis being
    unreachable never fails it. ``/readyz`` (and ``/healthz``, its old name)
    answers 200 when at least one lbs client runs and every running one
    can work (its last heartbeat less than 2 x ``Config.heartbeat_every``
    ago, its reader still reading), else 503 naming the others
    (:meth:`LbsCollector.readiness`). Each a small JSON body. Mount it in an
    application's own server to get them all from one port.
    """
    live_timeout = checked_live_timeout(live_timeout)
    metrics = make_wsgi_app(registry)
    collector = collector_for(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == LIVE_PATH:
            ok, body = collector.liveness(live_timeout)
        elif path in (READY_PATH, HEALTH_PATH):
            ok, body = collector.readiness()
        else:
            exposition: Iterable[bytes] = metrics(environ, start_response)
            return exposition
        payload = json.dumps(body).encode()
        start_response(
            "200 OK" if ok else "503 Service Unavailable",
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(payload))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [payload]

    return app


class _QuietHandler(WSGIRequestHandler):
    """Requests are not logged (a scrape every few seconds would fill stderr)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def start_server(
    port: int, addr: str, registry: CollectorRegistry, live_timeout: float = LIVE_TIMEOUT
) -> WSGIServer | None:
    """Serve :func:`make_app` on ``addr:port`` from a daemon thread; None (logged) when it cannot bind."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]

        class Server(ThreadingWSGIServer):
            address_family = family  # IPv6 addresses need AF_INET6

        server = make_server(
            str(sockaddr[0]),
            port,
            make_app(registry, live_timeout=live_timeout),
            Server,
            _QuietHandler,
        )
    except (
        Exception
    ) as exc:  # OSError (in use, bad address), gaierror...: log, never raise into lbs
        log.error("lbs_prometheus: cannot serve /metrics on %s:%s: %s", addr, port, exc)
        return None
    threading.Thread(target=server.serve_forever, daemon=True, name="lbs-prometheus-http").start()
    slot = worker_slot()
    log.info(
        "lbs_prometheus: serving http://%s:%d/metrics, %s and %s%s",
        addr,
        server.server_port,
        LIVE_PATH,
        READY_PATH,
        f" (worker process {slot[0]} of {slot[1]})" if slot else "",
    )
    return server


def stop_server(server: WSGIServer) -> None:
    """Stop serving and free the port (waits for ``serve_forever``'s next poll, up to 0.5 s)."""
    server.shutdown()
    server.server_close()


__all__ = [
    "HEALTH_PATH",
    "LIVE_PATH",
    "LIVE_TIMEOUT",
    "READY_PATH",
    "checked_live_timeout",
    "make_app",
    "start_server",
    "stop_server",
]
