"""What one open ``lbs dashboard`` costs Redis per second, beside ``lbs status --watch``'s refresh.

One service with a small idle fleet (2 ``lbs.Client`` in ``run()``, 20 streams held by them, so
the status reads go through every round: held streams, tokens). Each row, one round: a window of
the fleet alone, then a window with the reader added, both of the same length
(:class:`benchmarks.cost.Window`); the reader's cost is the second minus the first.

* **dashboard, N pages**: the app (``lbs.dashboard.create_app``, ``--refresh 2``) under uvicorn on
  a free port in a thread, N ``/events`` streams open (server-sent events, httpx): one snapshot
  per interval whatever N is (the live hub shares it).
* **lbs status --watch** (the baseline): ``collect_status(client, service)`` every 2 s, as
  ``lbs status --watch -n 2`` reads (with the reasons of the newest 100 dead letters).

``extra_info``: ``redis_cpu_ms_per_s`` (Redis CPU of the reader, ms per second),
``commands_per_s`` (the reader's INFO commandstats delta per second: ``{cmd: [calls, usec]}``),
``calls_per_s`` and ``commands_usec_per_s`` (all its commands: calls, and the µs Redis spent in
them), ``snapshots`` (live snapshots computed), ``pages``.
With ``--benchmark-disable`` (``make test``): windows of 0.5 s at a refresh of 0.25 s.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import uvicorn

import lbs
from lbs.dashboard import DashboardSettings, create_app
from lbs.status import collect_status

from .cost import Cost, Window

if TYPE_CHECKING:
    from .conftest import Bench

WINDOW, REFRESH = 30.0, 2.0
HELD = 20


async def _hold(note: lbs.Notification) -> None:
    await asyncio.sleep(3600)


@asynccontextmanager
async def fleet(url: str, service: str) -> AsyncIterator[None]:
    async with lbs.Producer(url, service) as producer:
        await producer.add_streams([f"s{i}" for i in range(HELD)])
    clients = [lbs.Client(url, service, f"w{i}", lbs.Config(drain_timeout=0)) for i in range(2)]
    runs = []
    for c in clients:
        await c.start()
        runs.append(asyncio.create_task(c.run(_hold, handle_signals=False)))
    try:
        yield
    finally:
        await asyncio.gather(*(c.close() for c in clients))
        await asyncio.gather(*runs, return_exceptions=True)


@asynccontextmanager
async def dashboard(
    url: str, service: str, refresh: float, pages: int
) -> AsyncIterator[dict[str, Any]]:
    app = create_app(DashboardSettings.make(url, [service], refresh=refresh))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, port=port, log_level="warning", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        await asyncio.sleep(0.01)
    got = {"events": 0}

    async def page(http: httpx.AsyncClient) -> None:
        async with http.stream("GET", f"http://127.0.0.1:{port}/events") as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    assert service in json.loads(line[6:])
                    got["events"] += 1

    async with httpx.AsyncClient(timeout=None) as http:
        tasks = [asyncio.create_task(page(http)) for _ in range(pages)]
        try:
            while got["events"] < pages:  # every page has its first snapshot
                await asyncio.sleep(0.01)
            yield {"hub": app.state.dashboard.hub}
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            server.should_exit = True
            await asyncio.to_thread(thread.join, 30)


@asynccontextmanager
async def status_watch(
    url: str, service: str, refresh: float, pages: int
) -> AsyncIterator[dict[str, Any]]:
    r = aioredis_client(url)

    async def loop() -> None:
        while True:
            await collect_status(r, service)
            await asyncio.sleep(refresh)

    task = asyncio.create_task(loop())
    try:
        yield {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await r.aclose()


def aioredis_client(url: str) -> Any:
    import redis.asyncio as aioredis

    return aioredis.Redis.from_url(url)


Reader = Callable[[str, str, float, int], AbstractAsyncContextManager[dict[str, Any]]]
CASES: list[tuple[str, Reader, int]] = [
    ("lbs status --watch -n 2", status_watch, 1),
    ("dashboard, 1 page open", dashboard, 1),
    ("dashboard, 5 pages open", dashboard, 5),
]
BASELINE = "lbs status --watch -n 2"


@pytest.mark.parametrize("name, reader, pages", CASES, ids=[c[0] for c in CASES])
def bench_dashboard_redis_cost(bench: Bench, name: str, reader: Reader, pages: int) -> None:
    bench.benchmark.group = "an open dashboard's Redis cost per second"
    seconds, refresh = (0.5, 0.25) if bench.benchmark.disabled else (WINDOW, REFRESH)
    out: dict[str, Any] = {}

    async def measured(service: str) -> None:
        admin = bench.redis()
        async with fleet(bench.url, service):
            await asyncio.sleep(min(2.0, seconds))  # the fleet settled: its streams held
            window = await Window.open(admin)
            await asyncio.sleep(seconds)
            alone = await window.close()
            async with reader(bench.url, service, refresh, pages) as state:
                hub = state.get("hub")
                reads0 = hub.reads if hub else 0
                window = await Window.open(admin)
                t0 = time.perf_counter()
                await asyncio.sleep(seconds)
                busy = await window.close()
                out["snapshots"] = (hub.reads - reads0) if hub else None
                out["elapsed"] = time.perf_counter() - t0
        out["alone"], out["busy"] = alone, busy

    bench(measured, setup=lambda: bench.service("dash"), rounds=1)
    alone, busy = out["alone"], out["busy"]
    info = bench.extra_info
    info["baseline"] = name == BASELINE
    info["fixed_duration"] = True
    info["pages"] = pages
    info["refresh_s"] = refresh
    info["window_s"] = round(busy.seconds, 2)
    info["redis_cpu_ms_per_s"] = round(
        max(0.0, busy.cpu / busy.seconds - alone.cpu / alone.seconds) * 1e3, 3
    )
    commands = _minus(busy, alone)
    info["commands_per_s"] = commands
    info["calls_per_s"] = round(sum(c for c, _ in commands.values()), 2)
    info["commands_usec_per_s"] = round(sum(u for _, u in commands.values()), 1)
    info["snapshots"] = out["snapshots"]


def _minus(busy: Cost, alone: Cost) -> dict[str, list[float]]:
    """Calls and µs per second of ``busy`` beyond ``alone`` (the reader's own), costliest first."""
    out = {}
    for cmd, (calls, usec) in busy.commands.items():
        c0, u0 = alone.commands.get(cmd, (0, 0))
        calls_s = calls / busy.seconds - c0 / alone.seconds
        usec_s = usec / busy.seconds - u0 / alone.seconds
        if calls_s > 0.05:
            out[cmd] = [round(calls_s, 2), round(max(0.0, usec_s), 1)]
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))
