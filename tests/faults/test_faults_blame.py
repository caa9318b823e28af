"""Fault 11: who a death is counted against. A process that dies (here: a poison pill kills it with
``os._exit``) counts a failed attempt only against the streams whose handler was running in it: the
poison pill reaches the dead letters after ``max_retries`` deaths, while the streams the process
merely held (read by a client of the notification API and queued for the application, never taken)
come back with no retry counted, however many times it dies.

Each worker is a real process (``_crash_worker.py``), killed by the poison pill it takes; this process
recovers its streams as another consumer of the fleet would (the deadline poller, ``reap-3.lua`` and
``requeue-6.lua``).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import redis.asyncio as aioredis

import lbs

from _fleet import FULL, HERE, SETTLE, TEST_TIMEOUT, Figures, Report, eventually, server

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)

TTL = 2.0
CRASHES = 4  # max_retries (3) + 1: the poison pill's last death dead-letters it
#: Bystanders one process holds when it dies: the issue's 100,000 at full size.
BYSTANDERS = 100_000 if FULL else 2_000
WORKER = str(HERE / "_crash_worker.py")


async def _crash(url: str, service: str, mode: str, hold: int) -> tuple[int, float, list[str]]:
    """Run one worker until the poison pill kills it: its exit code, when it died, what it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        WORKER,
        url,
        service,
        "doomed",
        str(TTL),
        mode,
        str(hold),
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        out = (await asyncio.wait_for(proc.stdout.read(), SETTLE * 3)).decode().splitlines()
        code = await asyncio.wait_for(proc.wait(), SETTLE)
    finally:
        if proc.returncode is None:  # it did not die as it should: never leave it running
            proc.kill()
            await proc.wait()
    return code, time.monotonic(), out


async def _recover(rescuer: lbs.Client, r: aioredis.Redis, service: str) -> float:
    """Poll the deadline index (as every consumer's recovery does) until nothing is pending; how long it took."""
    started = time.monotonic()

    async def drained() -> bool:
        await rescuer.recovery.poll_deadlines()
        return (await r.xpending(lbs.input_stream(service), lbs.group_name(service)))[
            "pending"
        ] == 0

    assert await eventually(
        drained, timeout=SETTLE * 3, every=0.05, what="the dead worker's streams re-queued"
    )
    return time.monotonic() - started


async def _entries(r: aioredis.Redis, key: str) -> dict[str, dict[bytes, bytes]]:
    """The entries of ``key`` by DataStreamName."""
    out = {}
    for _, fields in await r.xrange(key):
        name, _ = lbs.decode_input(fields[b"lbs-input"])
        out[name] = fields
    return out


def _retries(fields: dict[bytes, bytes]) -> int:
    return int(fields.get(b"_retry_count", 0))


async def test_a_poison_pill_that_kills_its_process_is_dead_lettered_and_its_bystanders_are_not(
    service: str, report: Report
) -> None:
    poisoned = service + "-poison"  # the worker's run() client's service (see _crash_worker.py)
    with server() as srv:
        r = aioredis.Redis.from_url(srv.url)
        async with lbs.Producer(srv.url, service) as producer:
            for i in range(0, BYSTANDERS, 10_000):
                await producer.add_streams(
                    [f"bystander-{j}" for j in range(i, min(i + 10_000, BYSTANDERS))]
                )
        async with lbs.Producer(srv.url, poisoned) as producer:
            await producer.add_stream("poison")
        rescuers = [
            lbs.Client(
                srv.url,
                name,
                "rescuer",
                lbs.Config(lock_ttl=TTL, deadline_batch=5_000),
                load_entrypoint_plugins=False,
            )
            for name in (service, poisoned)
        ]
        recoveries = []
        try:
            for crash in range(CRASHES):
                code, _, out = await _crash(srv.url, service, "queue", BYSTANDERS)
                assert code == 3, (
                    f"crash {crash + 1}: the worker did not die on the poison pill ({code}): {out}"
                )
                assert [json.loads(line) for line in out] == [
                    {"held": BYSTANDERS},
                    {"running": "poison"},
                ], out
                recoveries.append(
                    max(
                        [
                            await _recover(rescuers[0], r, service),
                            await _recover(rescuers[1], r, poisoned),
                        ]
                    )
                )
            waiting = await _entries(r, lbs.input_stream(service))
            dead = {
                **await _entries(r, lbs.dead_letter_stream(service)),
                **await _entries(r, lbs.dead_letter_stream(poisoned)),
            }
            poison_left = await _entries(r, lbs.input_stream(poisoned))
        finally:
            for rescuer in rescuers:
                await rescuer.close()
            await r.aclose()
    counted = sum(1 for name, f in waiting.items() if _retries(f))
    fig = Figures(
        "blame-queued-bystanders",
        BYSTANDERS + 1,
        CRASHES,
        0,
        CRASHES,
        BYSTANDERS + 1 - len(waiting) - len(dead),
        0,
        counted,
        len(dead),
        0,
        extra={"recovery_s": [round(t, 1) for t in recoveries]},
    )
    report(fig)
    assert list(dead) == ["poison"] and _retries(dead["poison"]) == CRASHES and not poison_left, (
        fig.line()
    )
    assert dead["poison"][b"_deaths"].decode().count(" ") == CRASHES - 1  # one id per counted death
    assert len(waiting) == BYSTANDERS and counted == 0, fig.line()


async def test_a_running_poison_pill_is_dead_lettered_after_max_retries_deaths(
    service: str, report: Report
) -> None:
    with server() as srv:
        r = aioredis.Redis.from_url(srv.url)
        async with lbs.Producer(srv.url, service) as producer:
            await producer.add_stream("poison")
        rescuer = lbs.Client(
            srv.url, service, "rescuer", lbs.Config(lock_ttl=TTL), load_entrypoint_plugins=False
        )
        try:
            for crash in range(CRASHES):
                code, _, out = await _crash(srv.url, service, "run", 1)
                assert code == 3 and out == ['{"running": "poison"}'], (
                    f"crash {crash + 1}: {code} {out}"
                )
                await _recover(rescuer, r, service)
            waiting = await _entries(r, lbs.input_stream(service))
            dead = await _entries(r, lbs.dead_letter_stream(service))
        finally:
            await rescuer.close()
            await r.aclose()
    report(Figures("blame-running-poison", 1, CRASHES, 0, CRASHES, 0, 0, CRASHES, len(dead), 0))
    assert waiting == {} and list(dead) == ["poison"] and _retries(dead["poison"]) == CRASHES
