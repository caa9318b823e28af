"""Shared by lbs-otel's tests: an SDK provider exporting to memory, and spans looked up by name."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def memory_provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A provider of its own (the global one stays unset) whose finished spans stay in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def named(spans: Iterable[ReadableSpan], name: str, **attributes: Any) -> list[ReadableSpan]:
    """The spans called ``name`` whose attributes include ``attributes``, in the order they ended."""
    return [
        s
        for s in spans
        if s.name == name and all((s.attributes or {}).get(k) == v for k, v in attributes.items())
    ]
