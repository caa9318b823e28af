"""Fault 4: the server stopped (SIGSTOP) for 3 x the lock TTL while streams are held."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from _fleet import SCALE, SETTLE, TEST_TIMEOUT, Fleet, Report, config, eventually, server, verdict

# On Valkey too in make test (tests/faults/conftest.py): a fault whose handling depends on the server.
pytestmark = [pytest.mark.timeout(TEST_TIMEOUT), pytest.mark.valkey_smoke]


async def test_server_stalled_for_three_ttls(service: str, report: Report) -> None:
    # Every lock expires during the stall (Redis's clock moves on). Streams
    # in flight at SIGSTOP, plus a few "hold" streams still running at
    # SIGCONT: their holders must be told (disowned, cancelled, LOCK_LOST)
    # before anyone else runs them, and nothing may be lost.
    ttl = 1.0
    stalls = SCALE
    duration = 6.0 * SCALE
    holds: set[str] = set()

    def work(note, label) -> float:  # type: ignore[no-untyped-def]
        if note.stream.startswith("hold-") and note.retry_count == 0 and note.stream not in holds:
            holds.add(note.stream)
            return 5 * ttl  # still running at SIGCONT
        return fleet.rng.uniform(0.005, 0.05)

    with server() as srv:
        fleet = Fleet(srv.url, service, ["a", "b", "c"], cfg=config(lock_ttl=ttl), work=work)
        async with fleet:
            feeder = asyncio.create_task(fleet.feed("s", int(100 * duration), duration))
            pid = srv.process.pid  # type: ignore[union-attr]
            faults = 0
            try:
                for k in range(stalls):
                    await asyncio.sleep(duration / (stalls + 1) / 2)
                    hold = [f"hold-{k}-{i}" for i in range(3)]
                    await fleet.register(hold)

                    async def holding(hold: list[str] = hold) -> bool:
                        return all(s in holds for s in hold)

                    await eventually(holding, timeout=10, what="hold streams running")
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        await asyncio.sleep(3 * ttl)
                    finally:
                        os.kill(pid, signal.SIGCONT)
                    faults += 1
                    await asyncio.sleep(duration / (stalls + 1) / 2)
            finally:
                os.kill(pid, signal.SIGCONT)
                await feeder
            settled = await fleet.settle(timeout=SETTLE)
            rec = fleet.rec
            told = {r.stream for r in rec.runs if rec.told(r)}
            unexplained = sorted(
                {r.stream for r in rec.runs if r.retry_count > 0 and r.stream not in told}
            )
            fig = await fleet.figures(
                "sigstop-3xttl",
                faults,
                settled=settled,
                retried_streams_never_disowned=len(unexplained),
            )
            why = fleet.explain()
    report(fig)
    problems = fig.problems(duplicated=False, retries=False)
    if unexplained:
        problems.append(
            f"{len(unexplained)} streams came back with a retry counted though no holder was "
            f"told it lost them: {unexplained[:5]}"
        )
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)
