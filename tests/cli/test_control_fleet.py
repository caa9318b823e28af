"""An operator's controls on a fleet of ``lbs worker`` processes with their default Config: pause
(also across a worker started while paused), release and cancel of running handlers, resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs.events import read_events

from _cli_helpers import HANDLERS, Proc, all_finished, cli_env, eventually, handled, run_lbs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _lbs(log: Path, *args: str) -> Any:
    return asyncio.to_thread(run_lbs, list(args), cli_env(log))


async def test_pause_release_cancel_resume_on_a_fleet_of_workers(
    redis_server: Any,
    r: aioredis.Redis,
    service: str,
    log: Path,
    start_worker: Callable[..., Proc],
) -> None:
    url = redis_server.url
    fleet = 2 if (os.cpu_count() or 1) <= 2 else 3
    workers = [
        start_worker(f"{HANDLERS}:mixed", "--service", service, "--url", url) for _ in range(fleet)
    ]
    producer = lbs.Producer(r, service)
    hold1, hold2 = await producer.add_streams(["hold-1", "hold-2"])
    await eventually(lambda: _is(len(handled(log, "started")) == 2), "both held streams started")

    done = await _lbs(log, "pause", service, "--url", url, "--reason", "deploy", "--by", "ops")
    assert done.returncode == 0, done.stderr
    # A worker started while paused (a deploy) takes nothing either.
    workers.append(start_worker(f"{HANDLERS}:mixed", "--service", service, "--url", url))

    async def joined() -> bool:  # its lease taken (a paused worker reads nothing: not in the group)
        leases = [k async for k in r.scan_iter(match=lbs.lease_key(service, "*"))]
        return len(leases) == fleet + 1

    await eventually(joined, "the late worker started")
    await producer.add_streams([f"ok-{i}" for i in range(6)])
    await asyncio.sleep(2.5)  # every worker looked at the pause at least twice
    assert handled(log, "done") == []

    # Release: the holder cancels the handler; the stream goes back (paused: not taken yet).
    done = await _lbs(log, "release", service, hold1, "--url", url, "--json", "--by", "ops")
    assert done.returncode == 0, done.stderr
    (released,) = json.loads(done.stdout)
    assert released["outcome"] == "released", released
    # Cancel: dead-lettered with the reason.
    done = await _lbs(
        log, "cancel", service, hold2, "--url", url, "--reason", "poison", "--by", "ops"
    )
    assert done.returncode == 0, done.stderr + done.stdout
    await eventually(lambda: _is(len(handled(log, "cancelled")) == 2), "both handlers cancelled")
    status = await _lbs(log, "status", service, "--url", url, "--json")
    st = json.loads(status.stdout)
    assert st["paused"]["by"] == "ops" and st["paused"]["reason"] == "deploy"
    assert st["backlog"] == 7 and st["pending"] == 0  # 6 new + hold-1 back; nothing taken

    done = await _lbs(log, "resume", service, "--url", url)
    assert done.returncode == 0, done.stderr
    await eventually(lambda: _is(len(handled(log, "done")) == 6), "the registrations done")
    await eventually(lambda: _is(len(handled(log, "started")) == 3), "hold-1 started again")
    again = handled(log, "started")[-1]
    assert again[1:] == ["hold-1", "0"]  # released: no retry counted
    async with lbs.DeadLetters(r, service) as dlq:
        (letter,) = await dlq.list(5)
    assert letter.failed_id == hold2 and letter.reason == "cancelled by ops: poison"

    kinds = [e.kind for e in await read_events(r, service)]
    for kind in ("paused", "released", "cancelled", "resumed"):
        assert kind in kinds, kinds
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert await w.wait() == 0, w.err()
    assert not await all_finished(r, service)  # hold-1 was handed back at the stop


async def _is(value: bool) -> bool:
    return value
