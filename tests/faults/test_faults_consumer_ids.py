"""Fault 6: a second client started with a consumer id that a live client uses."""

from __future__ import annotations

import asyncio

import pytest

import lbs

from _fleet import SCALE, SETTLE, TEST_TIMEOUT, Fleet, Report, config, eventually, server, verdict

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)


async def test_a_live_consumer_id_is_refused_to_a_second_client(
    service: str, report: Report
) -> None:
    ttl = 2.0
    n = 5 * SCALE

    def work(note, label) -> float:  # type: ignore[no-untyped-def]
        return (
            3600.0 if label == "dup-1" else fleet.rng.uniform(0.005, 0.05)
        )  # the first holds its streams

    with server() as srv:
        fleet = Fleet(
            srv.url,
            service,
            [],
            cfg=config(lock_ttl=ttl, max_streams=max(50, n)),
            work=work,
            concurrency=n,
        )
        async with fleet:
            first = await fleet.add_client("dup-1", consumer_id="dup")
            names = [f"held-{i}" for i in range(n)]
            await fleet.register(names)

            async def holding() -> bool:
                return first.held == n and len(fleet.rec.runs) >= n

            assert await eventually(holding, timeout=15), (
                f"the first client holds {first.held} of {n}"
            )
            second = fleet.make_client("dup-2", consumer_id="dup")
            refusal: BaseException | None = None
            try:
                await asyncio.wait_for(second.start(), timeout=3 * ttl + 5)
            except Exception as exc:
                refusal = exc
            finally:
                await second.close()
            await asyncio.sleep(
                2 * ttl
            )  # two lock TTLs: anything the second start disturbed shows by now
            held_after = first.held
            early = [
                fleet.show(r)
                for r in fleet.rec.runs
                if r.consumer != "dup-1" or r.retry_count > 0 or fleet.rec.told(r)
            ]
            await fleet.close_client("dup-1")  # hands its streams back
            third_started = True
            try:
                await fleet.add_client("dup-3", consumer_id="dup")
            except Exception as exc:
                third_started = False
                refusal_of_third: BaseException | None = exc
            else:
                refusal_of_third = None
            settled = await fleet.settle(timeout=SETTLE)
            fig = await fleet.figures(
                "duplicate-consumer-id",
                1,
                settled=settled,
                refused=type(refusal).__name__ if refusal else "no",
                held_after=f"{held_after}/{n}",
                third_started=third_started,
            )
            why = fleet.explain()
    report(fig)
    problems = fig.problems()
    if not (isinstance(refusal, lbs.ConfigurationError) and isinstance(refusal, lbs.LbsError)):
        problems.append(
            f"a second client with a live consumer id was not refused at start() with "
            f"lbs.ConfigurationError: {refusal!r}"
        )
    elif "in use" not in str(refusal):
        problems.append(f"the refusal does not say the id is in use: {refusal}")
    if held_after != n or early:
        problems.append(
            f"the first client lost or shared its streams (holds {held_after}/{n}): {early[:5]}"
        )
    if not third_started:
        problems.append(f"a client with the id of a closed one did not start: {refusal_of_third!r}")
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)
