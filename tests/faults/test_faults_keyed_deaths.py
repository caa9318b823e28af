"""Fault 12: a keyed message whose holders keep dying (issue 42). A key's handler hangs on its first
message and its holder, a real process (``_keyed_worker.py``), is killed with ``kill -9`` there, again
and again; each next process takes the key over through its own recovery (which re-queues the
registration under a new id) and reads it. A holder's death counts as a
failed hold against the message it was running: after 1 + ``max_retries`` such holds that message
alone goes to the dead letters, with its fields and the reason, and the next holder goes on with the
key's other messages, each processed once, in order. The key's registration itself never goes to
the dead letters (it used to, whole, on the last death: its delivery count, which recovery raises
at each death, passed ``max_retries``, and the key's messages were left in Redis with nothing
registered to run them).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys

from _fleet import HERE, SCALE, SETTLE, TEST_TIMEOUT, Figures, Report, eventually, server

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)

TTL = 1.0  # the workers' lock TTL: a killed holder's key is recovered about this long after
MAX_RETRIES = lbs.Config().max_retries  # the workers' (the default)
DEATHS = 1 + MAX_RETRIES  # holds of the hanging message, each lost with its holder
MESSAGES = 10 * SCALE
WORKER = str(HERE / "_keyed_worker.py")


async def _spawn(url: str, service: str, consumer: str, out: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        WORKER,
        url,
        service,
        consumer,
        str(TTL),
        out,
        stdout=subprocess.PIPE,
    )


async def _until_hanging(proc: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    """The worker's lines up to the one saying it started the hanging message (n = 0)."""
    assert proc.stdout is not None
    lines: list[dict[str, Any]] = []
    while not lines or lines[-1]["running"] != "0":
        raw = await asyncio.wait_for(proc.stdout.readline(), SETTLE * 3)
        assert raw, f"the worker exited ({await proc.wait()}) after {lines}"
        lines.append(json.loads(raw))
    return lines


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.kill()  # SIGKILL: no clean-up, its lock and its LBS entry are left to recovery
    await proc.wait()


async def test_a_keyed_message_whose_holders_keep_dying_is_dead_lettered_alone_and_the_key_goes_on(
    service: str, report: Report
) -> None:
    key = "account-7"
    out = _keys.hash_tag(service) + ":out"
    lbs_key, group = lbs.input_stream(service), lbs.group_name(service)
    with server() as srv:
        r = aioredis.Redis.from_url(srv.url, decode_responses=True)
        try:
            async with lbs.Publisher(srv.url, service) as pub:
                ids = await pub.publish_many([(key, {"n": i}) for i in range(MESSAGES)])
            killed: list[list[dict[str, Any]]] = []
            for death in range(DEATHS):
                proc = await _spawn(srv.url, service, f"doomed-{death}", out)
                try:
                    killed.append(await _until_hanging(proc))
                finally:
                    await _kill(proc)
            survivor = await _spawn(srv.url, service, "survivor", out)
            try:

                async def finished() -> bool:
                    return (
                        await r.xlen(out) >= MESSAGES - 1
                        and await r.xlen(lbs_key) == 0
                        and (await r.xpending(lbs_key, group))["pending"] == 0
                    )

                settled = await eventually(
                    finished, timeout=SETTLE, what="the key's other messages processed"
                )
                effects = [f for _, f in await r.xrange(out)]
                letters = [f for _, f in await r.xrange(_keys.dead_letter_stream(service))]
                left = await r.exists(
                    _keys.keyed_stream(service, key), _keys.key_state(service, key)
                )
                lbs_left = (await r.xlen(lbs_key), (await r.xpending(lbs_key, group))["pending"])
            finally:
                await _kill(survivor)
        finally:
            await r.aclose()

    fp = "_"  # Config.field_prefix
    poison = [f for f in letters if f.get("n") == "0"]
    whole = [f for f in letters if "n" not in f]  # a registration dead-lettered: no message fields
    processed = [(f["n"], f["id"]) for f in effects]
    expected = [(str(i), ids[i]) for i in range(1, MESSAGES)]
    fig = Figures(
        "keyed-holder-deaths",
        MESSAGES,
        len(processed),
        len(set(processed)),
        len(killed),
        len(set(expected) - set(processed)),
        len(processed) - len(set(processed)),
        0,
        len(letters),
        0,
        extra={"registrations_dead_lettered": len(whole), "left": left, "lbs_left": lbs_left},
    )
    report(fig)
    # Every killed holder was running the hanging message, alone from the second hold on.
    assert all(lines[-1]["id"] == ids[0] for lines in killed), killed
    assert not whole, f"the key's registration was dead-lettered whole: {whole}"
    assert settled, fig.line()
    assert len(letters) == 1 and len(poison) == 1, letters
    letter = poison[0]
    assert letter[fp + "failed_id"] == ids[0] and letter[fp + "key"] == key, letter
    assert letter[fp + "retry_count"] == str(MAX_RETRIES), letter
    assert f"failed in {DEATHS} holds" in letter[fp + "reason"], letter
    assert "holder" in letter[fp + "reason"], letter
    assert processed == expected, fig.line()  # each once, in order, after the dead-lettered one
    assert left == 0 and lbs_left == (0, 0), fig.line()  # drained: nothing of the key is left
