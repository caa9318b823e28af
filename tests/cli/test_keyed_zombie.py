"""A keyed holder stalled in its handler past its lock TTL (a zombie) while a successor runs far ahead
of it: when it comes back, its commit is refused and none of its effects is written, on Redis 8.x
and on 7.0 (the effects are written by the fenced commit itself, not before it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys

from _cli_helpers import HANDLERS, eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MESSAGES, STALL_AT, AHEAD = 200, 20, 150


async def test_a_zombie_holder_writes_no_effect_after_its_successor_ran_ahead(
    any_server: Any, service: str, start_worker: Any, log: Path, tmp_path: Path
) -> None:
    r = aioredis.Redis.from_url(any_server.url)
    out = _keys.hash_tag(service) + ":out"
    resume = tmp_path / "resume"
    async with lbs.Publisher(r, service) as pub:
        await pub.publish_many([("z", {"n": i}) for i in range(MESSAGES)])
    zombie = start_worker(
        f"{HANDLERS}:keyed_stall",
        "--service",
        service,
        "--url",
        any_server.url,
        "--consumer-id",
        "zombie",
        "--lock-ttl",
        "1",
        "--batch",
        "10",
        "--log-level",
        "info",
        LBS_TEST_STALL_AT=str(STALL_AT),
        LBS_TEST_RESUME=str(resume),
    )

    async def stalled() -> bool:
        return "stalled" in log.read_text()

    await eventually(stalled, "the zombie stalled in its handler")
    successor_effects: list[int] = []

    async def handle(batch: lbs.KeyedBatch) -> None:
        for m in batch.messages:
            batch.emit(out, {"key": batch.key, "n": m.fields["n"], "pid": "successor"}, m)
            successor_effects.append(int(m.fields["n"]))

    successor = lbs.Client(
        any_server.url,
        service,
        consumer_id="successor",
        config=lbs.Config(lock_ttl=1.0, read_block=0.05, deadline_poll_interval=0.1),
        load_entrypoint_plugins=False,
    )
    runner = asyncio.create_task(successor.run_keyed(handle, batch=10))
    try:

        async def ran_ahead() -> bool:
            return await r.xlen(out) >= STALL_AT + AHEAD

        await eventually(ran_ahead, f"the successor processing {AHEAD} messages past the zombie's")
        resume.touch()  # the zombie's handler returns: its commit (with its 10 effects) goes out

        async def refused() -> bool:
            return "effect(s) were not written" in zombie.err()

        await eventually(refused, "the zombie's commit refused")
        await successor.wait_finished(1, timeout=60)
    finally:
        await successor.close()
        await runner
    effects = [(int(f[b"n"]), f[b"pid"]) for _, f in await r.xrange(out)]
    assert [n for n, _ in effects] == list(range(MESSAGES))  # each once, in order
    zombie_pid = str(zombie.pid).encode()
    assert {pid for n, pid in effects if n < STALL_AT} == {zombie_pid}
    assert {pid for n, pid in effects if n >= STALL_AT} == {
        b"successor"
    }  # the zombie wrote nothing more
    assert successor_effects[0] == STALL_AT
    await r.aclose()
