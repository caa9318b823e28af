"""A consumer's own process metrics, read from the ``/metrics`` URL its journal announced.

A worker with ``lbs-prometheus`` serving tells the journal where (``lbs_process_info``: the
``metrics`` field of its ``started`` event). The consumers page reads each announced URL once per
page view, in parallel, with a short timeout and a size bound, and shows that consumer's ``lbs_*``
samples (histograms as their count and sum) and the process's own (``process_*``: CPU, memory, files).
Only ``http(s)://.../metrics`` URLs are read, and only Prometheus samples are shown, never the
body; a process that cannot be reached says why, and the page renders regardless.

The text format is parsed by ``prometheus_client`` (installed with ``lbs-prometheus``, the plugin
that serves these URLs); without it the page links the URL and reads nothing.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..events import Event

__all__ = ["FETCH_TIMEOUT", "MOST_BYTES", "ProcessMetrics", "announced", "read_all"]

#: Seconds to wait for one process's ``/metrics``.
FETCH_TIMEOUT = 1.0
#: The most bytes read of one ``/metrics`` answer.
MOST_BYTES = 1 << 20
#: Processes read per page view at most (the newest announcements first).
MOST_PROCESSES = 50


@dataclass(frozen=True)
class ProcessMetrics:
    """What one consumer's process said: ``rows`` of (name, labels, value), or ``error``."""

    url: str
    rows: list[tuple[str, str, float]] = field(default_factory=list)
    error: str = ""


def announced(events: Iterable[Event]) -> dict[str, str]:
    """Each consumer's metrics URL, from its newest ``started`` or ``tally`` event that has one
    (events oldest first)."""
    out: dict[str, str] = {}
    for e in events:
        if e.kind in ("started", "tally") and e.fields.get("metrics"):
            out[e.consumer] = e.fields["metrics"]
    return out


def _readable(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path == "/metrics"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as answer:  # http(s) only: _readable
        return str(answer.read(MOST_BYTES).decode("utf-8", "replace"))


def _rows(body: str, consumer: str) -> list[tuple[str, str, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    rows: list[tuple[str, str, float]] = []
    for family in text_string_to_metric_families(body):
        own = family.name.startswith("lbs_")
        if not own and not family.name.startswith("process_"):  # the process's CPU, memory, fds
            continue
        for s in family.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            labels = dict(s.labels)
            if own and labels.pop("consumer", consumer) != consumer:
                continue  # another client of the same process
            labels.pop("service", None)
            shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
            rows.append((s.name, shown, float(s.value)))
    return rows


async def _read(url: str, consumer: str) -> ProcessMetrics:
    if not _readable(url):
        return ProcessMetrics(url, error="not an http(s)://HOST/metrics URL: not read")
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        return ProcessMetrics(url, error="prometheus_client is not installed here: not read")
    try:
        body = await asyncio.to_thread(_get, url)
        return ProcessMetrics(url, _rows(body, consumer))
    except Exception as exc:  # unreachable, refused, not the text format: the page says so
        return ProcessMetrics(url, error=f"{type(exc).__name__}: {exc}"[:300])


async def read_all(urls: Mapping[str, str]) -> dict[str, ProcessMetrics]:
    """Each consumer's process metrics (at most :data:`MOST_PROCESSES`), read in parallel."""
    chosen = list(urls.items())[-MOST_PROCESSES:]
    found = await asyncio.gather(*(_read(url, consumer) for consumer, url in chosen))
    return {consumer: m for (consumer, _), m in zip(chosen, found)}
