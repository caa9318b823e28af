"""Fault 5: lbs's keys holding a value of the wrong type.

For each key, while it is wrong: no registered work is lost or
dead-lettered, the readers live on (no STREAM_TERMINATED), and a log record
names the key. Once the key is deleted the work flows and is finished.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import lbs
from lbs._keys import consumers_key, dead_letter_stream, fence_key, input_stream

from _fleet import SCALE, SETTLE, TEST_TIMEOUT, Fleet, Report, config, eventually, server, verdict

# On Valkey too in make test (tests/faults/conftest.py): a fault whose handling depends on the server.
pytestmark = [pytest.mark.timeout(TEST_TIMEOUT), pytest.mark.valkey_smoke]

CASES = {
    # case: (key of the service, the value SET there)
    "fence-abc": (fence_key, "abc"),
    "fence-max": (fence_key, "9223372036854775807"),  # INCRBY overflows; past 2^53 for Lua
    "consumers": (consumers_key, "x"),
    "dlq": (dead_letter_stream, "x"),  # with a malformed entry to dead-letter
    "lbs": (input_stream, "x"),  # replaced after the clients started
}


@pytest.mark.parametrize("case", list(CASES))
async def test_wrong_type_key(
    case: str, service: str, report: Report, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="lbs")
    make_key, value = CASES[case]
    key = make_key(service)
    ttl = 1.0
    good = [f"good-{i}" for i in range(20 * SCALE)]
    half = len(good) // 2
    with server() as srv:
        async with Fleet(srv.url, service, ["a", "b"], cfg=config(lock_ttl=ttl)) as fleet:
            r = fleet.r
            if case == "lbs":
                # The clients made the (empty) LBS with their group: put a string in its place.
                await r.delete(key)
                await r.set(key, value)
                refused = not await fleet.register(
                    ["while-broken"]
                )  # the producer cannot register into it
                fleet.uncertain.discard("while-broken")
            else:
                await r.set(key, value)
                refused = None
                await fleet.register(good[:half])
            malformed = ""
            if case == "dlq":
                eid = await r.xadd(input_stream(service), {lbs.INPUT_FIELD: "{not json"})
                malformed = eid.decode() if isinstance(eid, bytes) else str(eid)

            async def named() -> bool:
                return any(key in rec.getMessage() for rec in caplog.records)

            key_named = await eventually(named, timeout=5, what="a log record naming the key")
            # Long enough for any lock taken under the bad key to expire and be recovered.
            await asyncio.sleep(2 * ttl)
            alive = [label for label, t in fleet.tasks.items() if not t.done()]
            terminated = list(fleet.rec.terminated)
            await r.delete(key)  # fixed
            await fleet.register(good[half:])
            settled = await fleet.settle(timeout=SETTLE)
            letters = await fleet.dead_letter_entries()
            dead_names = [
                lbs.try_decode_input(f.get(lbs.INPUT_FIELD.encode(), b""))[0] for f in letters
            ]
            good_dead = sorted(n for n in dead_names if n in set(good))
            malformed_dead = None
            if case == "dlq":

                async def in_dlq() -> bool:
                    for f in await fleet.dead_letter_entries():
                        if f.get(lbs.INPUT_FIELD.encode()) == b"{not json":
                            return bool(f.get(b"_reason"))
                    return False

                malformed_dead = await eventually(
                    in_dlq, timeout=5, what="the malformed entry dead-lettered"
                )
            extra: dict[str, Any] = {
                "settled": settled,
                "key_named": key_named,
                "readers_alive": f"{len(alive)}/{len(fleet.tasks)}",
                "good_dead_lettered": len(good_dead),
            }
            if case == "lbs":
                extra["producer_refused"] = refused
            if case == "dlq":
                extra["malformed_dead_lettered"] = malformed_dead
            fig = await fleet.figures(f"wrong-type-{case}", 1, **extra)
            why = fleet.explain()
    report(fig)
    messages = [rec.getMessage()[:200] for rec in caplog.records if rec.name.startswith("lbs")][:2]
    problems = fig.problems(duplicated=False, holders=False, retries=False)
    if len(alive) != len(fleet.tasks) or terminated:
        problems.append(f"a reader died: {terminated}")
    if good_dead:
        problems.append(f"registered work dead-lettered: {good_dead[:5]}")
    if not key_named:
        problems.append(f"no log record names {key}; the first lbs records: {messages}")
    if not settled:
        problems.append("after the fix: " + fig.unsettled())
    if case == "dlq" and not malformed_dead:
        problems.append(
            f"the malformed entry {malformed} did not reach the dead-letter stream after the fix"
        )
    verdict(problems, why)
