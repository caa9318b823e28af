"""Live updates: one snapshot per interval shared by every open ``/events`` stream (not one Redis
read per page), none while nobody listens; over a real uvicorn server, the stream is
``text/event-stream`` and carries each service's counters."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

from lbs.dashboard import DashboardSettings, create_app
from lbs.dashboard.live import Hub

from _helpers import client, produce


async def test_every_listener_shares_one_snapshot_per_interval() -> None:
    calls = 0

    async def produce_snapshot() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return {"n": calls}

    hub = Hub(produce_snapshot, 0.05)
    got: list[list[int]] = [[], [], []]

    async def listen(i: int) -> None:
        async for text in hub.listen():
            got[i].append(json.loads(text)["n"])
            if len(got[i]) == 5:
                return

    await asyncio.wait_for(asyncio.gather(*(listen(i) for i in range(3))), 10)
    # Three pages, about five snapshots: read about five times, not fifteen.
    assert calls == hub.reads and calls <= 7, (calls, got)
    assert all(g == sorted(g) for g in got)
    assert hub.listeners == 0
    await asyncio.sleep(0.2)
    assert hub.reads == calls  # nobody listens: no read
    await hub.close()


@pytest.fixture
def served(redis_server: Any, service: str) -> Iterator[tuple[str, Any]]:
    """The dashboard of ``service`` under uvicorn on a free port, in a thread (its own loop)."""
    settings = DashboardSettings.make(redis_server.url, [service], refresh=0.2)
    app = create_app(settings)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", app.state.dashboard.hub
    finally:
        server.should_exit = True
        thread.join(30)


async def test_server_sent_events_carry_the_counters(
    redis_server: Any, service: str, served: tuple[str, Any]
) -> None:
    base, hub = served
    await produce(redis_server.url, service, "a", "b", "c")
    snapshots: list[dict[str, Any]] = []

    async def read_stream(http: httpx.AsyncClient, want: int) -> None:
        async with http.stream("GET", f"{base}/events") as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            event = ""
            async for line in resp.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "snapshot":
                    snapshots.append(json.loads(line[6:]))
                    if len(snapshots) >= want:
                        return

    async with httpx.AsyncClient(timeout=30) as http:
        await asyncio.wait_for(asyncio.gather(read_stream(http, 6), read_stream(http, 6)), 30)
    first = snapshots[0][service]
    assert first["waiting"] == 3 and first["held"] == 0 and first["alive"] == 0
    # Two pages read the same snapshots: reads grew by about half the snapshots received.
    assert hub.reads <= len(snapshots) // 2 + 2
    c = client(redis_server.url, service, "w1")
    await c.start()
    try:
        snapshots.clear()
        async with httpx.AsyncClient(timeout=30) as http:

            async def until_alive() -> None:
                while not snapshots or snapshots[-1][service]["alive"] != 1:
                    await read_stream(http, len(snapshots) + 1)

            await asyncio.wait_for(until_alive(), 30)
    finally:
        await c.close()
    for _ in range(100):  # both pages closed: the loop stops
        if hub.listeners == 0:
            break
        await asyncio.sleep(0.05)
    assert hub.listeners == 0
