"""The service's rate limit (``Config.rate_limit``, :mod:`lbs._consumer.ratelimit`), shared by a fleet of
consumer processes: what they take together over any span never exceeds the rate times the span plus
the windows' bursts. Upper bounds only (a loaded machine is slower, never faster); the backlog must
drain within a generous time."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis

from lbs._keys import input_stream, rate_prefix
from lbs.embedded import RedisServer

from _helpers import client, consumer_processes, eventually, group_has, is_true, take

pytestmark = pytest.mark.timeout(180)

RATE = 20.0
WINDOW = 0.25  # a burst of 5
BURST = 5
#: A handler's start lags its take by a scheduling delay or so; spans are judged with this slack.
LAG = 0.5

#: A consumer process: ``python -c CONSUMER URL SERVICE ID``. It prints a JSON line as each handler
#: starts (no-op handlers) and closes when its stdin does.
CONSUMER = f"""
import asyncio, json, sys, time
import lbs

async def main(url, service, consumer):
    config = lbs.Config(rate_limit={RATE}, rate_limit_window={WINDOW}, read_block=0.2, drain_timeout=5)
    client = lbs.Client(url, service, consumer_id=consumer, config=config, load_entrypoint_plugins=False)

    async def handle(note):
        print(json.dumps({{"at": time.time(), "who": consumer}}), flush=True)

    run = asyncio.create_task(client.run(handle, handle_signals=False))
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes it
    await client.close()
    await run

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
"""


async def _backlog(r: aioredis.Redis, service: str, n: int, tag: str = "rated") -> None:
    """``n`` registrations (``<tag>-<i>``) in one MULTI/EXEC."""
    async with r.pipeline(transaction=True) as pipe:
        for i in range(n):
            payload = json.dumps({"DataStreamName": f"{tag}-{i}", "Info": {}})
            pipe.xadd(input_stream(service), {"lbs-input": payload})
        await pipe.execute()


def _worst_span(starts: list[float], span: float) -> int:
    """The most starts within any ``span`` seconds."""
    starts = sorted(starts)
    worst, j = 0, 0
    for i, t in enumerate(starts):
        while starts[j] < t - span:
            j += 1
        worst = max(worst, i - j + 1)
    return worst


async def test_a_fleet_of_processes_shares_the_limit(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    procs_n = 3 if (os.cpu_count() or 1) >= 4 else 2
    n = 80
    starts: list[float] = []
    ran: Counter[str] = Counter()

    def seen(line: dict[str, Any]) -> None:
        starts.append(line["at"])
        ran[line["who"]] += 1

    async with consumer_processes(CONSUMER, redis_server.url, service, procs_n, seen):
        await eventually(lambda: group_has(r, service, procs_n), timeout=60)
        await _backlog(r, service, n)
        # Drains (about n / RATE = 4 s unloaded); generous on a loaded machine.
        await eventually(lambda: is_true(len(starts) == n), timeout=120)
    assert len(starts) == n
    # Together, over any span: at most the rate over it (with the handlers' lag) plus two bursts.
    for span in (1.0, 2.0):
        worst = _worst_span(starts, span)
        assert worst <= RATE * (span + LAG) + 2 * BURST + 1, (span, worst)
    whole = max(starts) - min(starts)
    assert n <= RATE * (whole + LAG) + 2 * BURST + 1, whole
    # Which process took how many is not asserted: a process starved of CPU on a loaded machine
    # may take none, and the limit holds all the same (tests/unit/test_ratelimit.py checks slices).
    assert sum(ran.values()) == n, ran


async def test_a_key_of_another_type_is_logged_once_and_the_reader_goes_on(
    redis_server: Any, r: aioredis.Redis, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The next two seconds' windows are strings: the reader reads nothing in them, says so once,
    # and takes the work once they are past.
    window_ms = 100
    now_s, now_us = await r.time()
    first = (now_s * 1000 + now_us // 1000) // window_ms
    for k in range(first, first + 20):
        await r.set(f"{rate_prefix(service)}{k}", "not a hash", px=10_000)
    c = client(redis_server.url, service, rate_limit=100, rate_limit_window=0.1)
    caplog.set_level(logging.ERROR, logger="lbs")
    await c.start()
    try:
        await _backlog(r, service, 3)
        notes = await take(c, 3, timeout=30)
        assert len(notes) == 3
    finally:
        await c.close()
    wrong = [rec for rec in caplog.records if "is not a hash" in rec.getMessage()]
    assert len(wrong) == 1, [rec.getMessage() for rec in caplog.records]


async def test_a_redis_restart_does_not_stop_the_reader(service: str) -> None:
    with RedisServer() as server:
        c = client(
            server.url,
            service,
            rate_limit=50,
            rate_limit_window=0.1,
            read_retry_initial=0.05,
            read_retry_max=0.2,
            lock_ttl=30,
        )
        await c.start()
        r = aioredis.Redis.from_url(server.url)
        try:
            await _backlog(r, service, 2)
            assert len(await take(c, 2)) == 2
            server.restart()  # the windows' counts go with it (at most one window more is given)
            started = time.monotonic()
            while True:
                try:
                    await _backlog(r, service, 2, "after")  # new names: the first two are held
                    break
                except Exception:  # the old process's pooled connection: the next call reconnects
                    assert time.monotonic() - started < 20
                    await asyncio.sleep(0.1)
            assert len(await take(c, 2, timeout=30)) == 2
        finally:
            await c.close()
            await r.aclose()


async def test_a_sharded_service_takes_its_limit_not_one_per_shard(
    redis_server: Any, service: str
) -> None:
    # Four shards, one process: each shard counts its own windows, so each takes a quarter of the
    # limit; together, over any span, no more than the service's limit.
    import lbs

    n = 60
    async with lbs.Producer(redis_server.url, service, shards=4) as producer:
        await producer.add_streams([f"s{i}" for i in range(n)])
    starts: list[float] = []

    async def handle(note: lbs.Notification) -> None:
        starts.append(time.monotonic())

    cfg = lbs.Config(rate_limit=RATE, rate_limit_window=WINDOW, read_block=0.2)
    c = lbs.ShardedClient(
        redis_server.url, service, "c", cfg, shards=4, load_entrypoint_plugins=False
    )
    runner = asyncio.create_task(c.run(handle))
    try:
        await eventually(lambda: is_true(len(starts) == n), timeout=120)
    finally:
        await c.close()
        await runner
    # Each shard's windows give a quarter of a burst, rounded up to one: 4 a window at most.
    for span in (1.0, 2.0):
        worst = _worst_span(starts, span)
        assert worst <= RATE * (span + LAG) + 2 * 4 * max(1, BURST // 4) + 1, (span, worst)
