"""Fault 7: a 10,000-field entry XADDed by hand into the LBS among good work.

Its ``lbs-input`` is valid, so it is an assignment like any other; what used
to break was putting it back: ``requeue-6.lua`` acked it first, then failed to
copy 10,000 fields ("too many results to unpack"), and the entry was gone. Its
handler fails here, so it must be handed back: it goes to the dead-letter
stream with the reason, and the original stays in the LBS (acked) as the record.
"""

from __future__ import annotations

import random

import pytest

import lbs

from _fleet import (
    SCALE,
    SETTLE,
    TEST_TIMEOUT,
    Fleet,
    Report,
    default_work,
    eventually,
    server,
    verdict,
)

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)


async def test_a_ten_thousand_field_entry_that_fails_is_dead_lettered_and_kept(
    service: str, report: Report
) -> None:
    normal = default_work(random.Random(7))

    def work(note: lbs.Notification, label: str) -> float:
        if note.stream == "big-1":
            raise RuntimeError("the handler fails on the big entry")
        return normal(note, label)

    with server() as srv:
        async with Fleet(srv.url, service, ["a", "b"], work=work) as fleet:
            await fleet.feed("before", 50 * SCALE, 1.0 * SCALE)
            args: list[object] = [
                "XADD",
                fleet.lbs_key,
                "*",
                lbs.INPUT_FIELD,
                lbs.encode_input("big-1"),
            ]
            for i in range(9_999):
                args += [f"junk-{i}", "x"]
            big_id = (await fleet.r.execute_command(*args)).decode()
            await fleet.feed("after", 50 * SCALE, 1.0 * SCALE)
            names = [n for n in fleet.registered if n != "big-1"]
            settled = await fleet.settle(names, timeout=SETTLE, empty=False)
            reasons: list[bytes] = []

            async def dead_lettered() -> bool:
                reasons[:] = [
                    f.get(b"_reason", b"")
                    for f in await fleet.dead_letter_entries()
                    if f.get(lbs.INPUT_FIELD.encode()) == lbs.encode_input("big-1")
                ]
                return bool(reasons)

            in_dlq = await eventually(
                dead_lettered, timeout=SETTLE, what="the big entry dead-lettered"
            )
            backlog = await fleet.backlog()
            kept = await fleet.r.xrange(fleet.lbs_key, big_id, big_id)
            big_runs = [r for r in fleet.rec.runs if r.stream == "big-1"]
            alive = all(not t.done() for t in fleet.tasks.values()) and not fleet.rec.terminated
            fig = await fleet.figures(
                "10000-field-entry",
                1,
                names=names,
                settled=settled,
                big_in_dlq=in_dlq,
                big_handled=len(big_runs),
                lbs_after=backlog,
                reason=(reasons or [b""])[0][:60].decode(),
            )
            why = fleet.explain(names)
    report(fig)
    problems = fig.problems(retries=False)
    if not alive:
        problems.append(f"a reader died: {fleet.rec.terminated}")
    if not (in_dlq and all(b"too many to copy" in r for r in reasons)):
        problems.append(
            f"entry {big_id} (big-1, 10,000 fields) is not in the dead-letter stream with its reason: "
            f"{reasons}"
        )
    if len(big_runs) != 1:
        problems.append(
            f"the 10,000-field entry was handed to a handler {len(big_runs)} times, not once"
        )
    if backlog != (1, 0) or not kept or len(kept[0][1]) != 10_000:
        problems.append(
            f"the original should stay in the LBS, acked, with its 10,000 fields: LBS {backlog}, "
            f"kept {len(kept[0][1]) if kept else 0} fields"
        )
    if not settled:
        problems.append(fig.unsettled())
    verdict(problems, why)
