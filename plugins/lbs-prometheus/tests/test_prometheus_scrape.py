"""An explicit PrometheusPlugin on a real client against real Redis, scraped over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from _prom_helpers import get, produce, prom_client, refused, scrape, take, value
from prometheus_client import CollectorRegistry

import lbs
from lbs_prometheus import PrometheusPlugin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def _until_refused(port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(refused, port):
        assert time.monotonic() < deadline, f"port {port} still serves after the last client closed"
        await asyncio.sleep(0.05)


async def _until(what: str, check: Callable[[], Awaitable[bool]], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"not {what} within {timeout}s"
        await asyncio.sleep(0.05)


async def test_take_done_hand_back_and_scan_move_the_scraped_numbers(
    redis_server: Any, service: str
) -> None:
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry())
    port = plugin.port
    assert port is not None and port > 0
    client = prom_client(redis_server.url, service, plugin, lock_ttl=2.0, heartbeat_interval=0.05)
    lbl = {"service": service, "consumer": client.id}
    await client.start()
    try:
        first = await asyncio.to_thread(scrape, port)
        assert value(first, "lbs_client_running", **lbl) == 1
        assert value(first, "lbs_held_streams", **lbl) == 0
        assert not value(first, "lbs_locks_acquired_total", **lbl)

        await produce(redis_server.url, service, "a", "b", "c")
        notes = await take(client, 3)
        await asyncio.sleep(0.2)  # a few heartbeat ticks with the locks held
        second = await asyncio.to_thread(scrape, port)
        assert value(second, "lbs_locks_acquired_total", **lbl) == 3
        assert value(second, "lbs_held_streams", **lbl) == 3
        ticks = value(second, "lbs_heartbeat_ticks_total", **lbl)
        assert ticks is not None and ticks >= 1
        assert (value(second, "lbs_heartbeat_locks_extended_total", **lbl) or 0) >= 3
        assert value(second, "lbs_heartbeat_locks_lost_total", **lbl) == 0
        # (not == ticks: a tick may land between the two updates while the scrape runs)
        assert (value(second, "lbs_heartbeat_tick_seconds_count", **lbl) or 0) >= 1

        by_name = {n.stream: n for n in notes}
        assert await client.done_stream("a") is lbs.DoneStatus.DONE
        assert await client.done_stream("b") is lbs.DoneStatus.DONE
        assert await client.hand_back("c")  # back to the LBS as a fresh entry, no retry counted
        (again,) = await take(client, 1)
        assert again.stream == "c" and again.entry_id != by_name["c"].entry_id
        third = await asyncio.to_thread(scrape, port)
        assert value(third, "lbs_locks_acquired_total", **lbl) == 4
        assert value(third, "lbs_locks_released_total", **lbl, status="DONE") == 2
        assert value(third, "lbs_streams_handed_back_total", **lbl) == 1
        assert value(third, "lbs_held_streams", **lbl) == 1

        assert await client.done_stream("c") is lbs.DoneStatus.DONE
        await client.recovery.scan()
        fourth = await asyncio.to_thread(scrape, port)
        assert value(fourth, "lbs_locks_released_total", **lbl, status="DONE") == 3
        assert value(fourth, "lbs_held_streams", **lbl) == 0
        assert value(fourth, "lbs_pel_depth", **lbl) == 0
        assert (value(fourth, "lbs_recovery_scan_duration_seconds_count", **lbl) or 0) >= 1
        # prometheus_client's Counter adds "_total" once: the lbs names already carry it.
        assert not any(name.endswith("_total_total") for name, _ in fourth)
    finally:
        await client.close()
    assert plugin.port is None
    await _until_refused(port)
    plugin.close()


async def test_run_handler_failures_are_handed_back_with_retry_counted(
    redis_server: Any, service: str
) -> None:
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry())
    port = plugin.port
    assert port is not None
    client = prom_client(redis_server.url, service, plugin)
    lbl = {"service": service, "consumer": client.id}

    async def handler(note: lbs.Notification) -> None:
        if note.stream == "flaky" and note.retry_count == 0:
            raise RuntimeError("first attempt fails")

    runner = asyncio.create_task(client.run(handler))
    try:
        await produce(redis_server.url, service, "s1", "s2", "s3", "flaky")
        await client.wait_finished(4, timeout=10)
        samples = await asyncio.to_thread(scrape, port)
        assert value(samples, "lbs_locks_acquired_total", **lbl) == 5
        assert value(samples, "lbs_locks_released_total", **lbl, status="DONE") == 4
        assert value(samples, "lbs_streams_handed_back_total", **lbl) == 1
        assert value(samples, "lbs_handler_failures_total", **lbl) == 1
        assert value(samples, "lbs_handler_seconds_count", **lbl) == 5
        assert value(samples, "lbs_held_streams", **lbl) == 0
    finally:
        await client.close()
        await runner
    plugin.close()
    assert plugin.port is None and await asyncio.to_thread(refused, port)


async def test_one_plugin_serves_two_clients_until_the_last_closes(
    redis_server: Any, service: str
) -> None:
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry())
    port = plugin.port
    assert port is not None
    a = lbs.Client(
        redis_server.url,
        service,
        "a",
        lbs.Config(read_block=0.1),
        plugins=[plugin],
        load_entrypoint_plugins=False,
    )
    b = lbs.Client(
        redis_server.url,
        service,
        "b",
        lbs.Config(read_block=0.1),
        plugins=[plugin],
        load_entrypoint_plugins=False,
    )
    await a.start()
    await b.start()
    await a.close()
    samples = await asyncio.to_thread(scrape, port)  # b still runs: still served
    assert value(samples, "lbs_client_running", service=service, consumer=a.id) == 0
    assert value(samples, "lbs_client_running", service=service, consumer=b.id) == 1
    await b.close()
    await _until_refused(port)
    # A client started later brings the server back, on the same port.
    c = lbs.Client(
        redis_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1),
        plugins=[plugin],
        load_entrypoint_plugins=False,
    )
    await c.start()
    try:
        assert plugin.port == port
        samples = await asyncio.to_thread(scrape, port)
        assert value(samples, "lbs_client_running", service=service, consumer=c.id) == 1
    finally:
        await c.close()
        plugin.close()


async def test_healthz_follows_the_heartbeat(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry())
    port = plugin.port
    assert port is not None
    status, body = await asyncio.to_thread(get, port, "/healthz")
    assert status == 503 and json.loads(body)["unhealthy"] == [
        {"reason": "no lbs client is running"}
    ]
    client = prom_client(
        redis_server.url, service, plugin, heartbeat_interval=0.1
    )  # healthy: a beat < 0.2 s ago
    await client.start()

    last: dict[str, Any] = {}

    async def health(expected: int) -> bool:
        status, body = await asyncio.to_thread(get, port, "/healthz")
        last["body"] = json.loads(body)
        return status == expected

    try:
        await _until("healthy", lambda: health(200))
        assert last["body"]["status"] == "ok"
        assert [c["consumer"] for c in last["body"]["clients"]] == [client.id]
        # A server that stalls writes stalls the heartbeat's script: the client turns unhealthy ...
        await r.client_pause(20_000, all=False)  # WRITE: writes (and scripts) wait
        try:
            await _until("unhealthy", lambda: health(503))
            (sick,) = last["body"]["unhealthy"]
            assert sick["consumer"] == client.id and sick["reason"].startswith("no heartbeat for")
        finally:
            await r.client_unpause()
        await _until("healthy again", lambda: health(200))  # ... and healthy again once it beats
        # /metrics is still there beside it.
        samples = await asyncio.to_thread(scrape, port)
        assert value(samples, "lbs_client_running", service=service, consumer=client.id) == 1
        assert (
            value(samples, "lbs_heartbeat_age_seconds", service=service, consumer=client.id) or 0
        ) < 20
    finally:
        await client.close()
        plugin.close()
