"""``lbs worker --log-format json``: every line on stderr one JSON object, the fields a log pipeline filters on."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs

from _cli_helpers import (
    HANDLERS,
    Proc,
    all_finished,
    cli_env,
    eventually,
    handled,
    leftovers,
    run_lbs,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _records(proc: Proc) -> list[dict[str, Any]]:
    lines = proc.err().splitlines()
    assert lines, "nothing logged"
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return records


@pytest.mark.parametrize("processes", [1, 2])
async def test_json_logs_carry_the_consumer_stream_token_retries_and_the_traceback(
    redis_server: Any,
    r: aioredis.Redis,
    service: str,
    log: Path,
    start_worker: Callable[..., Proc],
    processes: int,
) -> None:
    async with lbs.Producer(r, service) as producer:
        entry_ids = dict(zip(["a", "b"], await producer.add_streams(["a", "b"])))
    worker = start_worker(
        f"{HANDLERS}:fails_first",
        "--service",
        service,
        "--url",
        redis_server.url,
        "--consumer-id",
        "w",
        "--processes",
        str(processes),
        "--set",
        "retry_delay=0.05",
        "--log-format",
        "json",
    )

    async def both_done() -> bool:
        return sorted(s for _, s, _ in handled(log)) == ["a", "b"]

    await eventually(both_done, "both streams handled on their second attempt")
    await eventually(lambda: all_finished(r, service), "both streams finished (acked and deleted)")

    async def banner_logged() -> bool:  # child 0 logs it once its client started
        return '"banner": {' in worker.err()

    await eventually(banner_logged, "the start banner logged as a record")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.err()
    assert await leftovers(r, service) == (0, 0)
    records = _records(worker)  # every line, the supervisor's and the children's too
    started = [r for r in records if "banner" in r]
    assert len(started) == 1, records  # the start banner is a record, once
    assert started[0]["banner"]["service"] == service
    failed = {r["stream"]: r for r in records if r["message"].startswith("handler failed on")}
    assert sorted(failed) == ["a", "b"], records
    for stream, rec in failed.items():
        assert rec["level"] == "WARNING" and rec["service"] == service
        assert rec["consumer"].startswith("redis-consumer-w"), rec
        assert rec["entry_id"] == entry_ids[stream] and rec["retry_count"] == 0
        assert isinstance(rec["token"], int) and rec["token"] > 0
        assert rec["error"] == f"ValueError: first try of {stream}"
        assert rec["traceback"].startswith("Traceback (most recent call last):")
        assert "fails_first" in rec["traceback"]
    assert all({"time", "level", "logger", "message", "pid"} <= r.keys() for r in records)


def test_a_handler_module_that_raises_is_one_record_with_its_traceback(log: Path) -> None:
    done = run_lbs(
        ["worker", "tests.cli._broken:handle", "--service", "s", "--log-format", "json"],
        cli_env(log),
    )
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert len(records) == 1, done.stderr
    (rec,) = records
    assert rec["level"] == "ERROR" and "importing 'tests.cli._broken' failed" in rec["message"]
    assert rec["error"] == "RuntimeError: boom at import" and "_broken.py" in rec["traceback"]
