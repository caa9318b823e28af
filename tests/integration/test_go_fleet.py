"""Mixed fleets: lbs consumers beside the Go reference client v0.4, run as its protocol (``_goclient.py``).

Each test has a server of its own: the Go client rewrites ``notify-keyspace-events``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from _goclient import ConfigRefused, GoConsumer, GoStream
from _helpers import eventually

import lbs
from lbs.embedded import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A Redis 8.x with ``notify-keyspace-events`` empty, as Go wants to find it."""
    with RedisServer(config={"notify-keyspace-events": ""}) as s:
        yield s


def _client(url: str, service: str, consumer: str, **config: Any) -> lbs.Client:
    cfg = dict(read_block=0.1, deadline_poll_interval=0.1)
    cfg.update(config)
    return lbs.Client(url, service, consumer_id=consumer, config=lbs.Config(**cfg), load_entrypoint_plugins=False)


async def test_go_refuses_lbs_keyspace_events_unless_forced_and_lbs_keeps_what_go_sets(
        server: RedisServer, service: str) -> None:
    c = _client(server.url, service, "lbs-1")
    await c.start()  # adds K and x to an empty setting
    r = aioredis.Redis.from_url(server.url)
    try:
        assert set((await r.config_get("notify-keyspace-events"))["notify-keyspace-events"]) >= set("Kx")

        async def nothing(go: GoConsumer, s: GoStream) -> None:
            return None

        with pytest.raises(ConfigRefused):
            await GoConsumer(server.url, service, "go-1", nothing).start()
        go = GoConsumer(server.url, service, "go-1", nothing, force_config_override=True)
        await go.start()  # WithForceConfigOverride: exactly KEx
        go_set = (await r.config_get("notify-keyspace-events"))["notify-keyspace-events"]
        assert set(go_set) == set("KEx")
        await go.kill()
        await c.close()
        c = _client(server.url, service, "lbs-2")
        await c.start()  # KEx has what lbs needs: it changes nothing (lbs only ever adds flags)
        assert (await r.config_get("notify-keyspace-events"))["notify-keyspace-events"] == go_set
    finally:
        await c.close()
        await r.aclose()


async def test_a_group_go_created_at_dollar_is_reported_with_the_count_and_the_fix(
        server: RedisServer, service: str, caplog: pytest.LogCaptureFixture) -> None:
    async with lbs.Producer(server.url, service) as producer:
        await producer.add_streams([f"early-{i}" for i in range(5)])

    async def nothing(go: GoConsumer, s: GoStream) -> None:
        return None

    go = GoConsumer(server.url, service, "go-1", nothing, force_config_override=True)
    await go.start()  # XGROUP CREATE ... $: the five are behind the group
    await go.kill()
    caplog.set_level(logging.WARNING, logger="lbs")
    c = _client(server.url, service, "lbs-1")
    await c.start()
    warning = next(r.getMessage() for r in caplog.records if "will ever read them" in r.getMessage())
    assert f"] 5 entries of {lbs.input_stream(service)}" in warning
    assert f"XGROUP SETID {lbs.input_stream(service)} {lbs.group_name(service)} 0" in warning
    await c.close()
    # The fix, as the warning gives it, with every consumer stopped: the five are delivered.
    r = aioredis.Redis.from_url(server.url)
    await r.xgroup_setid(lbs.input_stream(service), lbs.group_name(service), "0")
    await r.aclose()
    c = _client(server.url, service, "lbs-2")
    await c.start()
    seen = [(await c.next_notification()) for _ in range(5)]
    assert sorted(n.stream for n in seen if n is not None) == [f"early-{i}" for i in range(5)]
    await c.done_streams([n for n in seen if n is not None])
    await c.close()


async def test_normal_flow_two_go_and_two_lbs_consumers_process_each_stream_once(
        server: RedisServer, service: str) -> None:
    names = [f"s{i}" for i in range(120)]
    runs: Counter[str] = Counter()
    by: Counter[str] = Counter()
    active: set[str] = set()
    overlaps: list[str] = []

    async def work(stream: str, who: str) -> None:
        if stream in active:
            overlaps.append(stream)
        active.add(stream)
        await asyncio.sleep(0.005)
        active.discard(stream)
        runs[stream] += 1
        by[who] += 1

    async def go_handler(go: GoConsumer, s: GoStream) -> None:
        await work(s.name, "go")

    async def lbs_handler(note: lbs.Notification) -> None:
        await work(note.stream, "lbs")

    lbs_clients = [_client(server.url, service, f"lbs-{i}") for i in range(2)]
    gos = [GoConsumer(server.url, service, f"go-{i}", go_handler, force_config_override=True) for i in range(2)]
    for c in lbs_clients:
        await c.start()  # the group at 0
    for g in gos:
        await g.start()
    runners = [asyncio.create_task(c.run(lbs_handler, concurrency=10)) for c in lbs_clients]
    try:
        async with lbs.Producer(server.url, service) as producer:
            for at in range(0, len(names), 20):
                await producer.add_streams(names[at:at + 20])
                await asyncio.sleep(0.02)

        async def all_done() -> bool:
            return sum(runs.values()) >= len(names)

        await eventually(all_done, timeout=60)
    finally:
        for c in lbs_clients:
            await c.close()
        await asyncio.gather(*runners)
        for g in gos:
            await g.kill()
    assert runs == Counter({n: 1 for n in names}) and overlaps == []
    assert by["go"] > 0 and by["lbs"] > 0
