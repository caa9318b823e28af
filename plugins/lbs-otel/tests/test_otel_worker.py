"""Across two processes: this one publishes inside a span, ``lbs worker`` (lbs-otel loaded from its
entry point, the SDK set up by the handler's module) handles. One trace runs from the publish to
the done; a stream whose first attempt failed gets a second ``lbs.handle`` linked to the first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import lbs
from lbs_otel import OtelPlugin

from _otel_helpers import memory_provider

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HERE = Path(__file__).parent


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _until_done(
    path: Path, streams: set[str], err: Path, timeout: float = 90.0
) -> list[dict[str, Any]]:
    """The worker's spans once every stream of ``streams`` has its ``lbs.done`` (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = _spans(path)
        done = {s["attributes"].get("lbs.stream") for s in spans if s["name"] == "lbs.done"}
        if streams <= done:
            return spans
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not within {timeout}s: lbs.done of {sorted(streams - done)}; spans "
                f"{[s['name'] for s in spans]}; worker stderr:\n{err.read_text()[-3000:]}"
            )
        time.sleep(0.1)


async def test_one_trace_from_publish_to_done_and_a_retry_linked_to_its_first_attempt(
    redis_server: Any, service: str, tmp_path: Path
) -> None:
    spans_file, err = tmp_path / "spans.jsonl", tmp_path / "worker.err"
    provider, exporter = memory_provider()
    with provider.get_tracer("test").start_as_current_span("publish") as publish:
        async with lbs.Producer(
            redis_server.url, service, plugins=[OtelPlugin()], load_entrypoint_plugins=False
        ) as producer:
            await producer.add_streams(["ok-1", "flaky-1"])
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("LBS_") or k == "LBS_REDIS_SERVER"
    }
    env.update(
        LBS_LOAD_PLUGINS="otel",  # lbs-otel alone, from its entry point, as installed
        LBS_OTEL_TEST_SPANS=str(spans_file),
        PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
    )
    command = [sys.executable, "-m", "lbs", "worker", "_otel_worker:handler", "--service", service]
    command += ["--url", redis_server.url, "--consumer-id", "ow", "--set", "retry_delay=0"]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        spans = _until_done(spans_file, {"ok-1", "flaky-1"}, err)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, err.read_text()

    trace_id = f"{publish.get_span_context().trace_id:032x}"
    publish_id = f"{publish.get_span_context().span_id:016x}"
    assert [s.name for s in exporter.get_finished_spans()] == ["publish"]
    assert {s["pid"] for s in spans} == {proc.pid}  # the worker's, exported there

    def of(stream: str, name: str) -> list[dict[str, Any]]:
        return [
            s for s in spans if s["name"] == name and s["attributes"].get("lbs.stream") == stream
        ]

    # ok-1: publish -> lbs.wait, lbs.handle -> lbs.done, one trace.
    (wait,) = of("ok-1", "lbs.wait")
    (handle,) = of("ok-1", "lbs.handle")
    (done,) = of("ok-1", "lbs.done")
    assert {wait["trace_id"], handle["trace_id"], done["trace_id"]} == {trace_id}
    assert wait["parent_id"] == handle["parent_id"] == publish_id
    assert done["parent_id"] == handle["span_id"]
    assert handle["kind"] == "CONSUMER" and handle["status"] == "UNSET"
    assert handle["attributes"]["lbs.consumer"] == "redis-consumer-ow"
    assert handle["attributes"]["lbs.retry_count"] == 0

    # flaky-1: the first attempt fails and is handed back; the second links to it; same trace.
    first, second = of("flaky-1", "lbs.handle")
    (back,) = of("flaky-1", "lbs.hand_back")
    (done,) = of("flaky-1", "lbs.done")
    assert {first["trace_id"], second["trace_id"], back["trace_id"], done["trace_id"]} == {trace_id}
    assert first["parent_id"] == second["parent_id"] == publish_id
    assert first["status"] == "ERROR" and first["attributes"]["lbs.retry_count"] == 0
    assert second["links"] == [first["span_id"]]
    assert second["attributes"]["lbs.retry_count"] == 1
    assert back["parent_id"] == first["span_id"] and done["parent_id"] == second["span_id"]
