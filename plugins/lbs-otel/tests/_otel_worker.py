"""The handlers ``lbs worker`` runs in test_otel_worker.py (``_otel_worker:handler``).

Importing it sets up the OpenTelemetry SDK as an application would, before the worker's client
starts: the global tracer provider, exporting every finished span as one JSON line to the file
``$LBS_OTEL_TEST_SPANS`` names (the in-memory exporter's spans cannot leave this process).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import lbs


class JsonLines(SpanExporter):
    """Appends each span as a JSON line (flushed at once: the test reads while the worker runs)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = [json.dumps(as_dict(s)) + "\n" for s in spans]
        with self.lock, open(self.path, "a") as f:
            f.writelines(lines)
        return SpanExportResult.SUCCESS


def as_dict(s: ReadableSpan) -> dict[str, object]:
    ctx = s.get_span_context()
    assert ctx is not None
    return {
        "name": s.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{s.parent.span_id:016x}" if s.parent is not None else None,
        "links": [f"{link.context.span_id:016x}" for link in s.links],
        "attributes": dict(s.attributes or {}),
        "status": s.status.status_code.name,
        "kind": s.kind.name,
        "pid": os.getpid(),
    }


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(JsonLines(os.environ["LBS_OTEL_TEST_SPANS"])))
trace.set_tracer_provider(provider)


async def handler(note: lbs.Notification) -> None:
    """Streams named ``flaky-*`` fail their first attempt."""
    if note.stream.startswith("flaky") and note.retry_count == 0:
        raise RuntimeError(f"{note.stream}: first attempt fails")
