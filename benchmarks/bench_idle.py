"""What idle consumers cost Redis: 1, 10 and 100 idle clients of one service, lbs beside plain loops.

* **lbs**: n ``lbs.Client(url, service, "idle-<i>", lbs.Config())`` with the
  installed plugins loaded (entry points, as an application gets them), each
  in ``run(handler, handle_signals=False)``, all in this process, nothing
  registered.
* **plain** (the baseline): n redis-py clients, each looping ``XREADGROUP GROUP
  g idle-<i> COUNT 50 BLOCK 1000 STREAMS s >`` on its own connection (BLOCK
  1000: lbs's default ``read_block`` of 1 s).

Each row, one round: Redis alone (no consumer connected, only the measuring
connection) over a window of 10 s; the fleet started, warmed up 3 s and
measured over a window of the same length (:class:`benchmarks.cost.Window`);
Redis alone again once the fleet has closed. The fleet's cost is its
window's Redis CPU per second minus the mean of the two alone windows' (they
differ by a few hundred µs/s from run to run: the 1-client rows are within
that noise, the 100-client rows far above it).
``extra_info``: ``clients``, ``redis_cpu_us_per_client_s`` (Redis CPU per
client per second, µs/s), ``fleet_core_percent`` (the whole fleet's share of
one core), ``redis_alone_cpu_us_per_s`` (what was subtracted),
``redis_alone_cpu_us_per_s_rounds`` (before, after),
``commands_per_client_s`` (INFO commandstats delta per client per second:
``{cmd: [calls, usec]}``). The baseline row has ``extra_info["baseline"] = True``. No XADD in the
window: the journal (on by default) writes nothing while nothing happens.

With ``--benchmark-disable`` (``make test``): windows and a warm-up of 0.25 s,
and at most 10 clients (the 100-client rows run 10).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._bench import plain_group

from .cost import Cost, Window

if TYPE_CHECKING:
    from .conftest import Bench

FLEETS = (1, 10, 100)
WINDOW, WARMUP = 10.0, 3.0
#: The plain loops' block: lbs's default ``read_block``, in ms.
BLOCK_MS = int(lbs.Config().read_block * 1000)
COUNT = lbs.Config().max_streams // 2


async def _idle(note: lbs.Notification) -> None:
    return None


@contextlib.asynccontextmanager
async def fleet_lbs(bench: Bench, service: str, n: int) -> AsyncIterator[None]:
    clients = [lbs.Client(bench.url, service, f"idle-{i}", lbs.Config()) for i in range(n)]
    runners: list[asyncio.Task[None]] = []
    try:
        for c in clients:
            await c.start()
            runners.append(asyncio.create_task(c.run(_idle, handle_signals=False)))
        yield
        for t in runners:
            assert not t.done(), t
    finally:
        await asyncio.gather(*(c.close() for c in clients))
        await asyncio.gather(*runners)


@contextlib.asynccontextmanager
async def fleet_plain(bench: Bench, service: str, n: int) -> AsyncIterator[None]:
    stream, group = await plain_group(bench.redis(), service)

    async def loop(r: aioredis.Redis, consumer: str) -> None:
        while True:
            await r.xreadgroup(group, consumer, {stream: ">"}, count=COUNT, block=BLOCK_MS)

    clients = [bench.redis() for _ in range(n)]
    for r in clients:
        await r.ping()
    loops = [asyncio.create_task(loop(r, f"idle-{i}")) for i, r in enumerate(clients)]
    try:
        yield
        for t in loops:
            assert not t.done(), t
    finally:
        for t in loops:
            t.cancel()  # blocked in XREADGROUP: the connection is dropped, which ends the BLOCK
        await asyncio.gather(*loops, return_exceptions=True)


SIDES: dict[str, Callable[[Bench, str, int], contextlib.AbstractAsyncContextManager[None]]] = {
    "lbs run() defaults+installed plugins": fleet_lbs,
    "redis-py XREADGROUP BLOCK 1000 loop": fleet_plain,
}
BASELINE = "redis-py XREADGROUP BLOCK 1000 loop"
CASES = [(impl, n) for n in FLEETS for impl in SIDES]


async def _window(r: aioredis.Redis, seconds: float) -> Cost:
    window = await Window.open(r)
    await asyncio.sleep(seconds)
    return await window.close()


@pytest.mark.parametrize("impl, clients", CASES, ids=[f"{i}-{n}" for i, n in CASES])
def bench_idle_clients(bench: Bench, impl: str, clients: int) -> None:
    bench.benchmark.group = f"idle, {clients} clients, Redis CPU per client-second"
    disabled = bench.benchmark.disabled
    seconds, warmup = (0.25, 0.25) if disabled else (WINDOW, WARMUP)
    n = min(clients, 10) if disabled else clients
    costs: list[tuple[Cost, Cost, Cost]] = []

    async def measured(service: str) -> None:
        admin = bench.redis()
        alone = await _window(admin, seconds)
        async with SIDES[impl](bench, service, n):
            await asyncio.sleep(warmup)
            busy = await _window(admin, seconds)
        after = await _window(admin, seconds)
        costs.append((alone, busy, after))

    bench(measured, setup=lambda: bench.service(f"idle{clients}"), rounds=1)
    alone, busy, after = costs[0]
    alone_rounds = [alone.cpu / alone.seconds, after.cpu / after.seconds]
    alone_per_s = sum(alone_rounds) / 2
    fleet_per_s = max(0.0, busy.cpu / busy.seconds - alone_per_s)
    info: dict[str, Any] = bench.extra_info
    info["baseline"] = impl == BASELINE
    info["fixed_duration"] = True
    info["clients"] = n
    info["redis_cpu_us_per_client_s"] = round(fleet_per_s / n * 1e6, 1)
    info["fleet_core_percent"] = round(fleet_per_s * 100, 2)
    info["redis_alone_cpu_us_per_s"] = round(alone_per_s * 1e6, 1)
    info["redis_alone_cpu_us_per_s_rounds"] = [round(x * 1e6, 1) for x in alone_rounds]
    info["commands_per_client_s"] = busy.per(n * busy.seconds)
    # The journal (Config.journal, on by default) writes nothing while nothing happens (its
    # "started" events are flushed within a second: in the warm-up, unless it is cut short).
    assert disabled or "xadd" not in busy.commands, busy.commands
    info["window_s"] = round(busy.seconds, 2)
