"""/livez and /readyz against a real Redis, over real HTTP: a Redis outage makes a client unready,
never dead; a blocked event loop makes it dead, whatever Redis does."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from _prom_helpers import get, prom_client
from prometheus_client import CollectorRegistry
from redis.backoff import NoBackoff
from redis.retry import Retry

import lbs
from lbs.embedded import RedisServer
from lbs_prometheus import PrometheusPlugin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = await asyncio.to_thread(get, port, path)
    return status, json.loads(body)


async def _until(
    port: int, path: str, status: int, timeout: float = 30.0
) -> tuple[int, dict[str, Any]]:
    """Poll ``path`` until it answers ``status`` (bounded); the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        got = await _probe(port, path)
        if got[0] == status:
            return got
        assert time.monotonic() < deadline, f"{path} not {status} within {timeout}s: {got}"
        await asyncio.sleep(0.1)


def _shut_down(server: RedisServer) -> None:
    """SHUTDOWN SAVE (a Redis outage that keeps the data: the group is there when it comes back)."""
    assert server.process is not None
    with server.client(socket_timeout=10, retry=Retry(NoBackoff(), 0)) as c:
        try:
            c.shutdown(save=True)
        except redis.exceptions.ConnectionError:
            pass  # the server closes the connection as it exits
    server.process.wait(timeout=30)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own, to stop and start again (started from the main thread)."""
    with RedisServer() as server:
        yield server


async def test_a_redis_outage_makes_readyz_fail_and_never_livez(
    own_server: RedisServer, service: str
) -> None:
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry())
    port = plugin.port
    assert port is not None
    # heartbeat every 1 s: not ready 2 s after the last beat; reads retried within 0.5 s.
    client = prom_client(
        own_server.url, service, plugin, lock_ttl=3.0, read_retry_initial=0.05, read_retry_max=0.5
    )
    await client.start()
    try:
        await _until(port, "/readyz", 200)
        status, live = await _probe(port, "/livez")
        assert status == 200 and live["status"] == "ok", live
        (entry,) = live["clients"]
        assert entry["consumer"] == client.id and entry["state"] == "running"
        assert entry["loop_lag"] >= 0

        _shut_down(own_server)
        # Not ready once the heartbeat is late; alive at every probe meanwhile and after.
        deadline = time.monotonic() + 30
        while (ready := await _probe(port, "/readyz"))[0] != 503:
            assert time.monotonic() < deadline, f"/readyz still {ready} with Redis down"
            status, live = await _probe(port, "/livez")
            assert status == 200, live
            await asyncio.sleep(0.1)
        (sick,) = ready[1]["unhealthy"]
        assert sick["consumer"] == client.id and sick["reason"].startswith("no heartbeat for")
        # /healthz, the old name, answers what /readyz does.
        status, old = await _probe(port, "/healthz")
        assert status == 503 and old["unhealthy"][0]["consumer"] == client.id
        for _ in range(10):  # a while longer into the outage: still alive
            status, live = await _probe(port, "/livez")
            assert status == 200 and live["status"] == "ok", live
            await asyncio.sleep(0.2)
        assert (await _probe(port, "/readyz"))[0] == 503

        own_server.restart()  # SHUTDOWN meets a refused connection; the same port and RDB file
        await _until(port, "/readyz", 200, timeout=60)
        await _until(port, "/healthz", 200)
        status, live = await _probe(port, "/livez")
        assert status == 200, live
    finally:
        await client.close()
        plugin.close()


async def test_a_blocked_event_loop_makes_livez_fail_and_names_it(
    redis_server: Any, service: str
) -> None:
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry(), live_timeout=0.2)
    port = plugin.port
    assert port is not None
    client = prom_client(redis_server.url, service, plugin)
    await client.start()
    try:
        await _until(port, "/livez", 200)
        # Block this (the client's) event loop until /livez has answered, from another thread:
        # the no-op it sends cannot run before, whatever the machine's load.
        answered: list[tuple[int, bytes]] = []
        probe = threading.Thread(target=lambda: answered.append(get(port, "/livez")))
        probe.start()
        try:
            probe.join(timeout=60)  # blocks the loop, as a handler calling time.sleep() would
        finally:
            assert not probe.is_alive(), "/livez did not answer within 60 s"
        ((status, raw),) = answered
        body = json.loads(raw)
        assert status == 503 and body["status"] == "unhealthy", body
        (dead,) = body["unhealthy"]
        assert dead["consumer"] == client.id and dead["service"] == service
        assert dead["reason"] == (
            "its event loop did not run a callback within 0.2s (blocked, or stopped)"
        )
        assert dead["thread"] == threading.current_thread().name
        # Where the loop's thread was: in this test, waiting for the probe.
        assert any(
            "test_a_blocked_event_loop_makes_livez_fail_and_names_it" in f
            for f in dead["blocked_at"]
        ), dead["blocked_at"]
        # Unblocked, it answers again; readiness never depended on the probe.
        await _until(port, "/livez", 200)
    finally:
        await client.close()
        plugin.close()


async def test_livez_probes_each_loop_of_several_clients(redis_server: Any, service: str) -> None:
    """Two clients, one on this loop and one on a loop of its own thread (the blocking facade's
    way): each named with its own loop's answer, and only the blocked one is dead."""
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry(), live_timeout=0.2)
    port = plugin.port
    assert port is not None
    here = prom_client(redis_server.url, service, plugin)
    other_loop = asyncio.new_event_loop()
    runner = threading.Thread(target=other_loop.run_forever, name="other-loop", daemon=True)
    runner.start()
    there = lbs.Client(
        redis_server.url,
        service,
        consumer_id="c2",
        config=lbs.Config(read_block=0.1),
        plugins=[plugin],
        load_entrypoint_plugins=False,
    )
    await here.start()
    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(there.start(), other_loop))
    release = threading.Event()
    try:
        _, body = await _until(port, "/livez", 200)
        assert sorted(c["consumer"] for c in body["clients"]) == sorted([here.id, there.id])
        assert all("loop_lag" in c for c in body["clients"]), body
        # Block the other loop only (until released): this loop's client stays alive.
        other_loop.call_soon_threadsafe(release.wait, 60)
        _, body = await _until(port, "/livez", 503)
        (dead,) = body["unhealthy"]
        assert dead["consumer"] == there.id and dead["thread"] == "other-loop", body
        assert any(f.endswith("in wait") for f in dead["blocked_at"]), dead
        alive = {c["consumer"]: c for c in body["clients"]}[here.id]
        assert "loop_lag" in alive and alive["state"] == "running"
        release.set()
        await _until(port, "/livez", 200)
    finally:
        release.set()
        await here.close()
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(there.close(), other_loop))
        other_loop.call_soon_threadsafe(other_loop.stop)
        runner.join(10)
        other_loop.close()
        plugin.close()
