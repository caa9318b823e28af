"""Defaults that fit how operators run workers: a stop lets running handlers finish, within a
Kubernetes pod's default 30 s grace period."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs

from _helpers import produce

pytestmark = pytest.mark.timeout(60)

#: Kubernetes' default terminationGracePeriodSeconds.
K8S_GRACE = 30.0


def test_the_default_drain_leaves_time_for_the_hand_back_within_a_pods_grace() -> None:
    drain = lbs.Config().drain_timeout
    assert 0 < drain <= K8S_GRACE - 5


async def test_close_lets_a_running_handler_finish_under_the_defaults(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    started, finished = asyncio.Event(), asyncio.Event()

    async def handler(note: lbs.Notification) -> None:
        started.set()
        await asyncio.sleep(1.0)  # a handler with a second of work left when the stop comes
        finished.set()

    (entry_id,) = await produce(redis_server.url, service, "s")
    c = lbs.Client(
        redis_server.url,
        service,
        consumer_id="c1",
        config=lbs.Config(read_block=0.1),
        load_entrypoint_plugins=False,
    )
    run = asyncio.create_task(c.run(handler))
    await asyncio.wait_for(started.wait(), 20)
    await c.close()
    await run
    assert finished.is_set()
    assert c.stats.done == 1 and c.stats.handed_back == 0
    assert await r.xlen(lbs.input_stream(service)) == 0, entry_id  # finished, not handed back
