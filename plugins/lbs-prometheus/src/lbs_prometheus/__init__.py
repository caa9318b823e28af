"""Prometheus metrics and health checks (liveness, readiness) for lbs clients.

Installed, this distribution is auto-loaded into every :class:`lbs.Client`
(entry-point group ``lbs``, name ``prometheus``) as :data:`default_plugin`:
it exports into prometheus_client's ``REGISTRY`` and opens no port unless
``LBS_PROMETHEUS_PORT`` is set. For a registry or a server of your own,
pass ``PrometheusPlugin(port=..., registry=...)`` in ``plugins=[...]``, or
mount :func:`make_app` (``/metrics``; ``/livez``: the event loops answer;
``/readyz``, or its old name ``/healthz``: the clients heartbeat) in your own
WSGI server.

Nothing is recorded per assignment: clients count what they do
themselves, and one collector per registry reads every started client's
counts when Prometheus scrapes.
"""

from __future__ import annotations

from ._collector import OWN, PREFIX, LbsCollector, collector_for
from ._http import HEALTH_PATH, LIVE_PATH, LIVE_TIMEOUT, READY_PATH, make_app
from ._plugin import (
    ADDR_ENV,
    DEFAULT_ADDR,
    LIVE_TIMEOUT_ENV,
    PORT_ENV,
    PrometheusPlugin,
    default_plugin,
    serve_from_env,
)

__version__ = "0.2.0"

__all__ = [
    "ADDR_ENV",
    "DEFAULT_ADDR",
    "HEALTH_PATH",
    "LIVE_PATH",
    "LIVE_TIMEOUT",
    "LIVE_TIMEOUT_ENV",
    "OWN",
    "PORT_ENV",
    "PREFIX",
    "READY_PATH",
    "LbsCollector",
    "PrometheusPlugin",
    "__version__",
    "collector_for",
    "default_plugin",
    "make_app",
    "serve_from_env",
]
