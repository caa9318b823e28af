"""Fault 12: a soak. Steady registrations with a few per cent of handlers failing (retried) and a few
per mille always failing (dead-lettered), every connection killed every interval, and one kill -9 of
Redis with an append-only file restarted in the middle. The audit accounts for every registration:
finished exactly once, or (the always-failing ones) dead-lettered with the handler's exception as its
reason; and what lbs keeps (tasks, descriptors, held streams, Redis memory) ends where it started.

Smoke size (``make test``): 30 s at 100 registrations/s, connections killed every 7.5 s (the same three
faults: a kill, the restart half-way, a kill). Full size (``make faults``): 10 minutes at 300/s,
connections killed every minute.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections import Counter

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._consumer.state import TOMBSTONES

from _fleet import (
    FULL,
    SETTLE,
    TEST_TIMEOUT,
    Fleet,
    Report,
    config,
    crash_and_restart,
    server,
    verdict,
)

DURATION = 600.0 if FULL else 30.0
RATE = 300 if FULL else 100
KILL_EVERY = 60.0 if FULL else 7.5

pytestmark = pytest.mark.timeout(TEST_TIMEOUT + DURATION)


def _fails(name: str, retry_count: int) -> bool:
    """Every 50th stream fails its first attempt; every 500th fails every time (it ends dead-lettered)."""
    i = int(name.rpartition("-")[2])
    return i % 500 == 3 or (i % 50 == 7 and retry_count == 0)


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _alive() -> Counter[str]:
    """lbs's per-stream records (and tasks) alive in this process."""
    return Counter(
        type(o).__name__
        for o in gc.get_objects()
        if type(o).__name__ in ("Notification", "Held", "Task")
    )


def _tasks() -> Counter[str]:
    """The asyncio tasks alive in this process, by coroutine."""
    return Counter(getattr(t.get_coro(), "__qualname__", "?") for t in asyncio.all_tasks())


async def _tasks_settled(limit: int, timeout: float = 15.0) -> Counter[str]:
    """The tasks once at most ``limit`` are left (handlers, retries and reconnects end on their own), or after
    ``timeout`` seconds: awaited, not slept for a fixed time, so a loaded machine only takes longer."""
    deadline = time.monotonic() + timeout
    while len(asyncio.all_tasks()) > limit and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return _tasks()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_soak_with_failures_connection_kills_and_a_restart_loses_and_repeats_nothing(
    service: str, report: Report
) -> None:
    def work(note: lbs.Notification, label: str) -> float:
        if _fails(note.stream, note.retry_count):
            raise RuntimeError(f"cannot process {note.stream}")
        return 0.005

    total = int(RATE * DURATION)
    killed: Counter[str] = Counter()
    # retry_delay shortened so a stream failing every time reaches the dead letters (4 attempts) well
    # within the settle time at either size.
    cfg = config(retry_delay=0.2, retry_delay_max=1.0, max_streams=100)
    with server(appendonly="yes", appendfsync="always") as srv:
        async with Fleet(
            srv.url, service, ["a", "b", "c"], cfg=cfg, concurrency=50, work=work
        ) as fleet:
            admin = aioredis.Redis.from_url(srv.url, socket_timeout=10)
            # Redis's memory is compared with the empty service's; the process's with a look one interval
            # in, once every client's connections are open and the work runs.
            before = {"redis_memory": (await admin.info("memory"))["used_memory"]}
            feeder = asyncio.create_task(fleet.feed("s", total, DURATION, batch=max(1, RATE // 10)))
            started = time.monotonic()
            restarted = False
            rss_early = 0
            faults = 0
            try:
                while not feeder.done():
                    await asyncio.wait({feeder}, timeout=KILL_EVERY)
                    if feeder.done():
                        break
                    elapsed = time.monotonic() - started
                    if not rss_early:
                        rss_early = _rss_kb()
                        before.update(
                            tasks=len(asyncio.all_tasks()),
                            task_names=_tasks(),
                            fds=_fds(),
                            alive=_alive(),
                        )
                    if not restarted and elapsed >= DURATION / 2:
                        await crash_and_restart(srv, downtime=0.5)
                        restarted = True
                        faults += 1
                        continue
                    for attempt in (1, 2):  # the first may meet a connection the restart closed
                        try:
                            killed["normal"] += int(
                                await admin.execute_command(
                                    "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
                                )
                            )
                            killed["pubsub"] += int(
                                await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                            )
                            faults += 1
                            break
                        except Exception as exc:
                            killed["failed"] += 1
                            print(f"soak: connection kill {attempt} failed: {exc!r}")
            finally:
                names = await feeder
            poison = [n for n in names if _fails(n, 1)]
            settled = await fleet.settle(
                [n for n in names if not _fails(n, 1)], timeout=SETTLE * 3, empty=True
            )
            poison = [n for n in fleet.expected() if _fails(n, 1)]
            letters = await fleet.dead_letter_entries()
            lettered = Counter(lbs.decode_input(f[b"lbs-input"])[0] for f in letters)
            reasons = {
                lbs.decode_input(f[b"lbs-input"])[0]: f.get(b"_reason", b"").decode()
                for f in letters
            }
            returned = Counter(r.stream for r in fleet.rec.runs if r.outcome == "returned")
            # What lbs keeps once the work is done: every client's held streams, tasks, descriptors.
            held = sum(c.held for c in fleet.clients.values())
            task_names = await _tasks_settled(before["tasks"] + 3)  # the last handlers' tasks end
            after = {
                "tasks": sum(task_names.values()),
                "task_names": task_names,
                "fds": _fds(),
                "redis_memory": (await admin.info("memory"))["used_memory"],
            }
            rss_end = _rss_kb()
            alive = _alive()
            fig = await fleet.figures(
                "soak",
                faults,
                names=[n for n in names if not _fails(n, 1)],
                settled=settled,
                restarted=restarted,
                killed=dict(killed),
                dead_lettered=len(letters),
                held_at_end=held,
                tasks=f"{before['tasks']}->{after['tasks']}",
                tasks_new=dict(after["task_names"] - before["task_names"]),
                fds=f"{before['fds']}->{after['fds']}",
                redis_memory_kb=f"{before['redis_memory'] // 1024}->"
                f"{after['redis_memory'] // 1024}",
                rss_kb=f"{rss_early}->{rss_end}",
                alive=f"{dict(before['alive'])}->{dict(alive)}",
            )
            why = fleet.explain(limit=5)
            await admin.aclose()
    report(fig)
    ok = set(fleet.expected()) - set(poison)
    lost = sorted(n for n in ok if returned[n] == 0)
    twice = sorted(n for n in ok if returned[n] > 1)
    problems = fig.problems(retries=False)
    if not settled:
        problems.append(fig.unsettled())
    if lost:
        problems.append(f"never finished: {lost[:5]}")
    if twice:
        problems.append(f"finished more than once: {twice[:5]}")
    missing = [n for n in poison if lettered[n] != 1]
    if missing:
        problems.append(
            f"{len(missing)} always-failing streams not dead-lettered exactly once: {missing[:5]}"
        )
    stray = sorted(n for n in lettered if n not in set(poison))
    if stray:
        problems.append(
            f"{len(stray)} streams dead-lettered that should have finished: {stray[:5]}"
        )
    bad_reason = [n for n in poison if "RuntimeError" not in reasons.get(n, "")]
    if bad_reason:
        problems.append(
            f"dead letters without the handler's exception in their reason: {bad_reason[:3]}"
        )
    if not restarted or fig.faults < 2:
        problems.append(f"faults not injected: restarted={restarted}, faults={fig.faults}")
    if held:
        problems.append(f"{held} streams still held after the work was done")
    # lbs's records in the process (this test's and whatever earlier tests left): bounded, not growing
    # with the work (the clients keep at most TOMBSTONES finished records each).
    grown = {k: alive[k] - before["alive"][k] for k in ("Held", "Notification")}
    if any(v > 3 * TOMBSTONES for v in grown.values()):
        problems.append(f"lbs records kept growing: {grown}")
    # Slack for connections a pool opens late, up to its peak concurrency: 2-4 more at the smoke size, 7 once
    # on a machine running a second suite beside it; a leak per fault (every interval) would pass it at full
    # size. (Sockets in CLOSE_WAIT are no sign of a leak here: idle pool connections a CLIENT KILL closed stay
    # so until their next use replaces them.)
    if after["fds"] > before["fds"] + 10:
        problems.append(f"descriptors grew: {before['fds']} -> {after['fds']}")
    if after["tasks"] > before["tasks"] + 3:
        problems.append(
            f"tasks grew: {before['tasks']} -> {after['tasks']}: "
            f"{dict(after['task_names'] - before['task_names'])}"
        )
    if after["redis_memory"] > before["redis_memory"] + 4 * 1024 * 1024:
        problems.append(f"Redis memory grew: {before['redis_memory']} -> {after['redis_memory']}")
    verdict(problems, why)
    assert len(names) == total
