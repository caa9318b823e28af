"""OpenTelemetry traces for lbs: from the producer's span to the handler, and what became of it.

Installed, this distribution is loaded into every :class:`lbs.Client`, :class:`lbs.Producer`
and :class:`lbs.Publisher` (entry-point group ``lbs``, name ``otel``) as :data:`default_plugin`,
which uses the global tracer provider. A producer's current span goes into each registration
(``traceparent``, ``tracestate``); a client whose tracer provider is an SDK's starts each
handler's span as its child. With the OpenTelemetry API alone (no SDK set up) nothing is traced
and ``run()``'s handler is not even wrapped. Pass ``OtelPlugin(tracer_provider=...)`` in
``plugins=[...]`` for a provider of your own.

Without ``opentelemetry-api`` the plugin says so once, at a client's start, and does nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import lbs

__version__ = "0.1.0"

log = logging.getLogger("lbs_otel")


class MissingOpenTelemetry:
    """Stands in for the plugin when ``opentelemetry-api`` cannot be imported: warns once."""

    def __init__(self, error: str) -> None:
        self.error = error
        self._warned = False

    @lbs.hookimpl
    def lbs_client_started(self, client: Any) -> None:
        if not self._warned:
            self._warned = True
            log.warning("lbs-otel is installed but cannot trace: %s", self.error)


try:
    from ._plugin import (
        LINK_FIELD,
        SYSTEM,
        TRACEPARENT,
        TRACESTATE,
        OtelPlugin,
        context_of,
    )
except ModuleNotFoundError as exc:  # pragma: no cover - opentelemetry-api is a dependency
    if not (exc.name or "").startswith("opentelemetry"):
        raise
    #: What the entry point loads.
    default_plugin: Any = MissingOpenTelemetry(f"{exc.name} is not installed")
else:
    default_plugin = OtelPlugin()

__all__ = [
    "LINK_FIELD",
    "SYSTEM",
    "TRACEPARENT",
    "TRACESTATE",
    "MissingOpenTelemetry",
    "OtelPlugin",
    "__version__",
    "context_of",
    "default_plugin",
]
