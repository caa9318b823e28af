"""Prometheus metrics and a health check for lbs clients.

Installed, this distribution is auto-loaded into every :class:`lbs.Client`
(entry-point group ``lbs``, name ``prometheus``) as :data:`default_plugin`:
it exports into prometheus_client's ``REGISTRY`` and opens no port unless
``LBS_PROMETHEUS_PORT`` is set. For a registry or a server of your own,
pass ``PrometheusPlugin(port=..., registry=...)`` in ``plugins=[...]``, or
mount :func:`make_app` (``/metrics`` and ``/healthz``) in your own WSGI
server.

Nothing is recorded per assignment: clients count what they do
themselves, and one collector per registry reads every started client's
counts when Prometheus scrapes.
"""

from __future__ import annotations

from ._collector import OWN, PREFIX, LbsCollector, collector_for
from ._http import HEALTH_PATH, make_app
from ._plugin import (
    ADDR_ENV,
    DEFAULT_ADDR,
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
    "OWN",
    "PORT_ENV",
    "PREFIX",
    "LbsCollector",
    "PrometheusPlugin",
    "__version__",
    "collector_for",
    "default_plugin",
    "make_app",
    "serve_from_env",
]
