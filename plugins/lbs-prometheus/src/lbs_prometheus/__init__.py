"""Prometheus metrics for lbs clients.

Installed, this distribution is auto-loaded into every :class:`lbs.Client`
(entry-point group ``lbs``, name ``prometheus``) as :data:`default_plugin`:
it records into prometheus_client's ``REGISTRY`` and opens no port unless
``LBS_PROMETHEUS_PORT`` is set. For a registry or a server of your own,
pass ``PrometheusPlugin(port=..., registry=...)`` in ``plugins=[...]``.
"""

from __future__ import annotations

from ._plugin import (
    ADDR_ENV,
    DEFAULT_ADDR,
    PORT_ENV,
    PREFIX,
    PrometheusPlugin,
    default_plugin,
    serve_from_env,
)

__version__ = "0.1.0"

__all__ = [
    "ADDR_ENV",
    "DEFAULT_ADDR",
    "PORT_ENV",
    "PREFIX",
    "PrometheusPlugin",
    "__version__",
    "default_plugin",
    "serve_from_env",
]
