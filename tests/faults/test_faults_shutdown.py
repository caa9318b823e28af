"""Fault 8: shutdown races. close() from another task and again in run()'s
finally; two concurrent close() calls; SIGTERM to a worker process;
hand_back() while the stream's run() handler is running."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest

import lbs

from _fleet import (
    SCALE,
    SETTLE,
    TEST_TIMEOUT,
    Fleet,
    Report,
    config,
    eventually,
    server,
    spawn_worker,
    stop_worker,
    verdict,
    worker_lines,
)

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)


def holding_work(fleet_ref: list[Fleet], holder: str):  # type: ignore[no-untyped-def]
    """``holder``'s handlers run until cancelled; everyone else's take 5-50 ms."""

    def work(note: lbs.Notification, label: str) -> float:
        return 3600.0 if label == holder else fleet_ref[0].rng.uniform(0.005, 0.05)

    return work


async def held_by(fleet: Fleet, label: str, n: int) -> None:
    async def ok() -> bool:
        return (
            fleet.clients[label].held == n
            and sum(1 for r in fleet.rec.runs if r.consumer == label) >= n
        )

    assert await eventually(ok, timeout=15), f"{label} holds {fleet.clients[label].held} of {n}"


@contextlib.asynccontextmanager
async def s1_holding(url: str, service: str, n: int) -> AsyncIterator[Fleet]:
    """A fleet of one client, s1, holding ``n`` streams whose handlers run until cancelled."""
    ref: list[Fleet] = []
    fleet = Fleet(
        url,
        service,
        ["s1"],
        work=holding_work(ref, "s1"),
        concurrency=n,
        cfg=config(max_streams=max(50, n)),
    )
    ref.append(fleet)
    async with fleet:
        await fleet.register([f"held-{i}" for i in range(n)])
        await held_by(fleet, "s1", n)
        yield fleet


async def left_behind(fleet: Fleet, consumer_id: str) -> tuple[int, int]:
    """(entries pending to ``consumer_id`` in the group, 1 if its lease is still there else 0)."""
    summary = await fleet.r.xpending(fleet.lbs_key, fleet.group)
    mine = sum(
        int(c["pending"])
        for c in summary.get("consumers") or []
        if (c["name"].decode() if isinstance(c["name"], bytes) else c["name"]) == consumer_id
    )
    return mine, int(await fleet.r.exists(lbs.lease_key(fleet.service, consumer_id)))


async def test_close_from_another_task_then_again_in_finally(service: str, report: Report) -> None:
    # The fleet runs every client the README's way: run() in a task, close()
    # in its finally. close_client() calls close() from this task while that
    # run() is in its handlers, so close() runs twice, concurrently.
    n = 10 * SCALE
    with server() as srv:
        async with s1_holding(srv.url, service, n) as fleet:
            s1 = fleet.clients["s1"]
            await fleet.close_client("s1")  # both close() calls have returned
            pending, leases = await left_behind(fleet, s1.id)
            await fleet.add_client("s2")
            settled = await fleet.settle(timeout=SETTLE)
            fig = await fleet.figures(
                "close-twice",
                1,
                settled=settled,
                pending_after_close=pending,
                lease_after_close=leases,
            )
            again = [fleet.show(r) for r in fleet.rec.runs if r.consumer == "s2" and r.retry_count]
            why = fleet.explain()
    report(fig)
    problems = fig.problems()
    if pending or leases:
        problems.append(
            f"after close() returned, {pending} entries were still pending to the closed consumer "
            f"and its lease was {'still there' if leases else 'gone'}"
        )
    if again:
        problems.append(f"handed-back streams came back with a retry counted: {again[:5]}")
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)


async def test_two_concurrent_close_calls_both_wait_for_the_shutdown(
    service: str, report: Report
) -> None:
    n = 10 * SCALE
    with server() as srv:
        async with s1_holding(srv.url, service, n) as fleet:
            s1 = fleet.clients["s1"]
            at_return: dict[int, tuple[bool, int]] = {}

            async def closer(k: int) -> None:
                await s1.close()
                # Right as this call returns: had the shutdown finished (hook
                # lbs_client_closed, after the hand-back), and is nothing held?
                at_return[k] = ("s1" in fleet.rec.closed, s1.held)

            await asyncio.wait_for(asyncio.gather(closer(1), closer(2)), 30)
            pending, leases = await left_behind(fleet, s1.id)
            await fleet.add_client("s2")
            settled = await fleet.settle(timeout=SETTLE)
            fig = await fleet.figures(
                "close-concurrently",
                2,
                settled=settled,
                at_return={k: f"closed={c},held={h}" for k, (c, h) in sorted(at_return.items())},
                pending_after_close=pending,
                lease_after_close=leases,
            )
            why = fleet.explain()
    report(fig)
    problems = fig.problems()
    early = {k: v for k, v in at_return.items() if not v[0] or v[1]}
    if early:
        problems.append(
            f"close() returned before the shutdown finished ({{call: (closed, held)}}): {early}"
        )
    if pending or leases:
        problems.append(
            f"after both close() calls, {pending} entries were pending to the closed consumer and "
            f"its lease was {'still there' if leases else 'gone'}"
        )
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)


async def test_sigterm_to_a_worker_process(service: str, report: Report) -> None:
    # The worker's TTL is 30 s: within the bounded wait below, only a
    # hand-back (not an expiry) can bring its streams back.
    n = 5 * SCALE
    ttl, drain = 30.0, 0.5
    with server() as srv:
        async with Fleet(srv.url, service, []) as fleet:
            names = [f"held-{i}" for i in range(n)]
            await fleet.register(names)
            proc = spawn_worker(srv.url, service, "w1", ttl, drain, concurrency=n)
            code: int | None = None
            tail = ""
            try:
                taken = await worker_lines(proc, n, timeout=30)
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    code = await asyncio.to_thread(proc.wait, 15)
                except subprocess.TimeoutExpired:
                    code = None
                if code is not None and proc.stdout is not None:
                    tail = proc.stdout.read().strip()
            finally:
                stop_worker(proc)
            await fleet.add_client("rescuer")
            settled = await fleet.settle(timeout=10)
            retried = [fleet.show(r) for r in fleet.rec.runs if r.retry_count]
            fig = await fleet.figures(
                "sigterm-worker", 1, settled=settled, exit_code=code, worker_took=len(taken)
            )
            why = fleet.explain()
    report(fig)
    problems = []
    if code != 0:
        problems.append(
            f"the worker did not exit with 0 within 15 s of SIGTERM: {code} (output after: {tail!r})"
        )
    if fig.lost:
        problems.append(
            f"{fig.lost} of its {n} streams not back and finished within 10 s (the worker's lock TTL "
            f"is {ttl} s, so only a hand-back brings them back this soon)"
        )
    if retried:
        problems.append(f"streams came back with a retry counted: {retried[:5]}")
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)


async def test_hand_back_cancels_the_running_handler_first(service: str, report: Report) -> None:
    k = 3 * SCALE
    first_attempt: set[str] = set()
    ref: list[Fleet] = []

    def work(note: lbs.Notification, label: str) -> float:
        if note.stream.startswith("hb-") and note.stream not in first_attempt:
            first_attempt.add(note.stream)
            return 3600.0  # runs until cancelled
        return ref[0].rng.uniform(0.005, 0.05)

    with server() as srv:
        fleet = Fleet(
            srv.url,
            service,
            ["a", "b"],
            work=work,
            concurrency=k + 10,
            cfg=config(max_streams=max(50, k + 10)),
        )
        ref.append(fleet)
        async with fleet:
            hb = [f"hb-{i}" for i in range(k)]
            await fleet.register(hb)
            feeder = asyncio.create_task(fleet.feed("s", 100 * SCALE, 1.0 * SCALE))

            async def running() -> bool:
                return all(s in first_attempt for s in hb)

            assert await eventually(running, timeout=15)
            for name in hb:
                (run,) = [r for r in fleet.rec.runs if r.stream == name]
                await fleet.clients[run.consumer].hand_back(name)
            await feeder
            settled = await fleet.settle(timeout=SETTLE)
            rec = fleet.rec
            hb_runs = [r for r in rec.runs if r.stream in set(hb)]
            firsts = {
                name: min((r for r in hb_runs if r.stream == name), key=lambda r: r.t0)
                for name in hb
            }
            handed = {s: t for (_, s, _, _, t) in rec.handed_back if s in set(hb)}
            not_cancelled = [fleet.show(r) for r in firsts.values() if r.outcome != "cancelled"]
            late = [
                n for n, r in firsts.items() if r.t1 is None or n not in handed or r.t1 > handed[n]
            ]
            together = rec.overlaps(hb_runs, valid_only=False)
            fig = await fleet.figures(
                "hand-back-while-running",
                k,
                settled=settled,
                first_runs_cancelled=f"{k - len(not_cancelled)}/{k}",
                cancelled_before_hand_back=f"{k - len(late)}/{k}",
                two_handlers_at_once=len(together),
            )
            why = fleet.explain()
    report(fig)
    problems = fig.problems()
    if not_cancelled:
        problems.append(f"hand_back() left the running handler running: {not_cancelled[:3]}")
    if late:
        problems.append(f"handed back before its handler was cancelled: {late[:3]}")
    if together:
        problems.append(
            "two handlers ran one stream at once: "
            f"{[(fleet.show(a), fleet.show(b)) for a, b in together[:3]]}"
        )
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)
