"""Fault 7: a 10,000-field entry XADDed by hand into the LBS among good work."""

from __future__ import annotations

import pytest

import lbs

from _fleet import SCALE, TEST_TIMEOUT, Fleet, Report, eventually, server, verdict

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)


async def test_a_ten_thousand_field_entry_is_dead_lettered(service: str, report: Report) -> None:
    with server() as srv:
        async with Fleet(srv.url, service, ["a", "b"]) as fleet:
            await fleet.feed("before", 50 * SCALE, 1.0 * SCALE)
            args: list[object] = ["XADD", fleet.lbs_key, "*", lbs.INPUT_FIELD, lbs.encode_input("big-1")]
            for i in range(9_999):
                args += [f"junk-{i}", "x"]
            big_id = (await fleet.r.execute_command(*args)).decode()
            await fleet.feed("after", 50 * SCALE, 1.0 * SCALE)
            settled = await fleet.settle(timeout=30 * SCALE)
            reasons: list[bytes] = []

            async def dead_lettered() -> bool:
                reasons[:] = [f.get(b"_reason", b"") for f in await fleet.dead_letter_entries()
                              if f.get(lbs.INPUT_FIELD.encode()) == lbs.encode_input("big-1")]
                return bool(reasons)

            in_dlq = await eventually(dead_lettered, timeout=10, what="the big entry dead-lettered")
            big_runs = [r for r in fleet.rec.runs if r.stream == "big-1"]
            alive = all(not t.done() for t in fleet.tasks.values()) and not fleet.rec.terminated
            fig = await fleet.figures("10000-field-entry", 1, settled=settled, big_in_dlq=in_dlq,
                                      big_handled=len(big_runs), reason=(reasons or [b""])[0][:60].decode())
            why = fleet.explain()
    report(fig)
    problems = fig.problems(retries=False)
    if not alive:
        problems.append(f"a reader died: {fleet.rec.terminated}")
    if not (in_dlq and all(reasons)):
        problems.append(f"entry {big_id} (big-1, 10,000 fields) is not in the dead-letter stream with a reason")
    if big_runs:
        problems.append(f"the 10,000-field entry was handed to a handler {len(big_runs)} times")
    if not settled:
        problems.append(f"the LBS did not drain: {fig.extra['lbs_left']} (XLEN/pending)")
    verdict(problems, why)
