"""Fault 1: connections killed under a running fleet (CLIENT KILL every 0.5 s)."""

from __future__ import annotations

from collections import Counter

import pytest
import redis.asyncio as aioredis

from _fleet import SCALE, SETTLE, TEST_TIMEOUT, Fleet, Report, chaos, server, verdict

# On Valkey too in make test (tests/faults/conftest.py): a fault whose handling depends on the server.
pytestmark = [pytest.mark.timeout(TEST_TIMEOUT), pytest.mark.valkey_smoke]


async def test_connection_kills_lose_and_repeat_nothing(service: str, report: Report) -> None:
    # Every 0.5 s, alternately: every normal connection but the killer's (the
    # clients' batches, blocked reads, scripts; the producer's and the test's
    # too), and every Pub/Sub connection (the keyspace listeners).
    duration = 6.0 * SCALE
    total = int(100 * duration)
    killed: Counter[str] = Counter()
    with server() as srv:
        async with Fleet(srv.url, service, ["a", "b", "c"]) as fleet:
            killer = aioredis.Redis.from_url(srv.url)

            async def kill(n: int) -> None:
                if n % 2 == 0:
                    killed["normal"] += int(
                        await killer.execute_command(
                            "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"
                        )
                    )
                else:
                    killed["pubsub"] += int(
                        await killer.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
                    )

            try:
                async with chaos(0.5, kill) as sent:
                    await fleet.feed("s", total, duration)
                faults = sent()
            finally:
                await killer.aclose()
            settled = await fleet.settle(timeout=SETTLE)
            fig = await fleet.figures(
                "connection-kills", faults, killed=dict(killed), settled=settled
            )
            why = fleet.explain()
    report(fig)
    assert fig.registered > 0 and fig.faults > 0
    problems = fig.problems()
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)
