"""Faults 2 and 3: Redis killed with -9 and started again on the same port,
with an append-only file (nothing is lost) and without persistence (everything is)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from _fleet import (
    SCALE,
    SETTLE,
    TEST_TIMEOUT,
    Fleet,
    Report,
    crash_and_restart,
    eventually,
    server,
    verdict,
)

# On Valkey too in make test (tests/faults/conftest.py): a fault whose handling depends on the server.
pytestmark = [pytest.mark.timeout(TEST_TIMEOUT), pytest.mark.valkey_smoke]


async def keyspace_flags(r: aioredis.Redis) -> str:
    reply = await r.config_get("notify-keyspace-events")
    value = next(iter(reply.values()), "") if reply else ""
    return value.decode() if isinstance(value, bytes) else str(value)


def has_kx(flags: str) -> bool:
    return "K" in flags and ("x" in flags or "A" in flags)


async def test_restart_with_aof_loses_and_repeats_nothing(service: str, report: Report) -> None:
    # appendfsync always: whatever Redis acknowledged survives kill -9. No
    # notify-keyspace-events on the command line: lbs sets it with CONFIG
    # SET at start, which the restart forgets, so lbs must set it again.
    duration = 4.0 * SCALE
    restarts = SCALE
    with server(appendonly="yes", appendfsync="always") as srv:
        async with Fleet(srv.url, service, ["a", "b", "c"]) as fleet:
            flags_before = await keyspace_flags(fleet.r)
            feeder = asyncio.create_task(fleet.feed("s", int(100 * duration), duration))
            faults = 0
            try:
                for _ in range(restarts):
                    await asyncio.sleep(duration / (restarts + 1))
                    await crash_and_restart(srv, downtime=0.5)
                    faults += 1
            finally:
                await feeder
            settled = await fleet.settle(timeout=SETTLE)
            flags: list[str] = []

            async def flags_back() -> bool:
                flags.append(await keyspace_flags(fleet.r))
                return has_kx(flags[-1])

            reapplied = await eventually(flags_back, timeout=15, every=0.2, what="keyspace flags")
            fig = await fleet.figures(
                "restart-aof",
                faults,
                settled=settled,
                keyspace_events=f"{flags_before!r}->{(flags or [''])[-1]!r}",
            )
            why = fleet.explain()
    report(fig)
    assert has_kx(flags_before), (
        f"lbs did not set notify-keyspace-events at start: {flags_before!r}"
    )
    problems = fig.problems()
    if not settled:
        problems.append(fig.unsettled())
    if not reapplied:
        problems.append(
            f"notify-keyspace-events is {flags[-1] if flags else '?'!r} 15 s after the restart: "
            "lbs did not set Kx again"
        )
    verdict(problems, why)


async def test_restart_without_persistence_keeps_working_and_tokens_grow(
    service: str, report: Report
) -> None:
    # Every key is lost: the LBS, its group, the locks, the fencing counter.
    # Work registered before is gone with it (not counted); work registered
    # after must all be finished, with tokens above every earlier one.
    duration = 2.0 * SCALE
    with server() as srv:
        async with Fleet(srv.url, service, ["a", "b", "c"]) as fleet:
            before = await fleet.feed("pre", int(100 * duration), duration)
            await asyncio.sleep(0.1)  # some of it still in flight
            await crash_and_restart(srv, downtime=0.5)
            after = await fleet.feed("post", int(100 * duration), duration)
            settled = await fleet.settle(after, timeout=SETTLE)
            pre = {r.token for r in fleet.rec.runs if r.stream in set(before)}
            post = {r.token for r in fleet.rec.runs if r.stream in set(after)}
            fig = await fleet.figures(
                "restart-no-persistence",
                1,
                names=after,
                settled=settled,
                max_token_before=max(pre, default=None),
                min_token_after=min(post, default=None),
            )
            why = fleet.explain(after)
    report(fig)
    assert pre and post, "no tokens seen on one side of the restart"
    problems = fig.problems(retries=False)
    if not settled:
        problems.append(fig.unsettled())
    backwards = sorted(t for t in post if t <= max(pre))
    if backwards:
        problems.append(
            f"{len(backwards)} tokens issued after the restart are <= {max(pre)}, the largest "
            f"before it: {backwards[:5]}"
        )
    verdict(problems, why)
