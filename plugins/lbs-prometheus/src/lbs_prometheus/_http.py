"""The HTTP side: ``/healthz`` beside prometheus_client's ``/metrics`` app, on a wsgiref server thread."""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from lbs.plugins import worker_slot

from ._collector import collector_for

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("lbs_prometheus")

#: Where the health check answers; every other path is prometheus_client's exposition.
HEALTH_PATH = "/healthz"


def make_app(registry: CollectorRegistry) -> WSGIApplication:
    """A WSGI app: ``/healthz`` (the registry's lbs clients) and, on any other path, ``/metrics``.

    ``/healthz`` answers 200 with a small JSON body when at least one lbs
    client runs and every running one is healthy (its last heartbeat less
    than 2 x ``Config.heartbeat_every`` ago, its reader still reading), else
    503 naming the unhealthy ones. Mount it in an application's own server
    to get both from one port.
    """
    metrics = make_wsgi_app(registry)
    collector = collector_for(registry)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") != HEALTH_PATH:
            exposition: Iterable[bytes] = metrics(environ, start_response)
            return exposition
        ok, body = collector.health()
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


def start_server(port: int, addr: str, registry: CollectorRegistry) -> WSGIServer | None:
    """Serve :func:`make_app` on ``addr:port`` from a daemon thread; None (logged) when it cannot bind."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]

        class Server(ThreadingWSGIServer):
            address_family = family  # IPv6 addresses need AF_INET6

        server = make_server(str(sockaddr[0]), port, make_app(registry), Server, _QuietHandler)
    except (
        Exception
    ) as exc:  # OSError (in use, bad address), gaierror...: log, never raise into lbs
        log.error("lbs_prometheus: cannot serve /metrics on %s:%s: %s", addr, port, exc)
        return None
    threading.Thread(target=server.serve_forever, daemon=True, name="lbs-prometheus-http").start()
    slot = worker_slot()
    log.info(
        "lbs_prometheus: serving http://%s:%d/metrics and %s%s",
        addr,
        server.server_port,
        HEALTH_PATH,
        f" (worker process {slot[0]} of {slot[1]})" if slot else "",
    )
    return server


def stop_server(server: WSGIServer) -> None:
    """Stop serving and free the port (waits for ``serve_forever``'s next poll, up to 0.5 s)."""
    server.shutdown()
    server.server_close()


__all__ = ["HEALTH_PATH", "make_app", "start_server", "stop_server"]
