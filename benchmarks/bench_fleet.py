"""Fleets: K consumer processes of one service on one Redis, beside the plain loop and the Go client's commands.

Run with ``make bench-fleet`` (these rows alone, then ``python -m benchmarks.report``);
:mod:`benchmarks.fleet` runs the processes and says what each side does. Every row runs
``Config()`` defaults (``lbs-fair-off``: ``fair_dispatch=False``) with the installed plugins, as
an application gets them, and sets ``extra_info``: ``consumers``, ``handled_per_s`` (started in
the window / its length), ``backlog`` (offered but not started when the window closed),
``redis_cpu_pct`` (Redis's CPU over the window, % of one core), ``redis_cpu_us_per_message`` and
``commands_per_message`` (INFO cpu and commandstats over the window, per entry started),
``p50_ms``/``p99_ms`` (producer's send to handler start, over the entries started in the window).
The plain loop's row is each group's baseline (``extra_info["baseline"]``), except where its
serial loop cannot keep up by design (handlers that await).

* **Steady** (``bench_fleet_steady``): producer processes (one per 20,000/s) send ``rate``
  registrations a second for :data:`SECONDS` (ticks of 5 ms); the window closes when every one has
  started, or 1 s after the last send; handlers do nothing. Sides: plain, Go, lbs ``run()``,
  ``run()`` with fair dispatch off, and ``run_keyed()`` with a ``Publisher`` over 1,000 keys
  (defaults, and ``linger=0``) and over 100,000 keys (:data:`benchmarks.fleet.KEYED`).
* **Backlog** (``bench_fleet_drain``): :data:`BACKLOG` registrations (keyed: messages over 1,000
  keys) are waiting when the fleet starts; the window closes when every one has started, so
  ``handled_per_s`` is the fleet's drain rate.
* **Fair dispatch** (``bench_fleet_fair``): on and off, with handlers that hold their process for
  20 ms (CPU-bound work) registered in bursts of 10 per consumer once a second (a fifth of what the
  fleet can do), and handlers that await 100 ms (I/O-bound work), 250 a second per consumer, steady.

Fleet sizes are 1, 2 and 4 consumers, and 8, 12, 16... while two cores are left over for Redis and
the producers (the cores are read at run time); ``LBS_FLEET_CONSUMERS=1,2`` chooses them. Rates are
500, 2,000 and 10,000 a second, and 40,000 on 8 cores or more (``LBS_FLEET_RATES``); the window
``LBS_FLEET_SECONDS`` (10) and the backlog ``LBS_FLEET_BACKLOG`` (200,000). One round a row.
With ``--benchmark-disable`` (``make test``), two consumers, 500/s for 0.5 s and a backlog of 1,000.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from .fleet import KEYED, Result, cores, publisher, run_fleet

if TYPE_CHECKING:
    from .conftest import Bench

SECONDS = float(os.environ.get("LBS_FLEET_SECONDS", "10"))
BACKLOG = int(os.environ.get("LBS_FLEET_BACKLOG", "200000"))
BASELINE = "plain"
LABELS = {
    "plain": "redis-py XREADGROUP COUNT 50 BLOCK + XACK",
    "go": "Go client's commands: SET mutex NX PX, DEL + XACK",
    "lbs": "lbs run() defaults",
    "lbs-fair-off": "lbs run() fair_dispatch=False",
    **{
        side: f"lbs run_keyed({'' if linger is None else f'linger={linger:g}'}), Publisher over "
        f"{keys:,} keys"
        for side, (keys, linger) in KEYED.items()
    },
}
STEADY_SIDES = ("plain", "go", "lbs", "lbs-fair-off", *KEYED)
#: Handler: registrations a second per consumer, the producer's tick (1 s: a burst once a second),
#: the sides (a baseline first where there is one).
FAIR = {
    "block-20": (10, 1.0, ("plain", "lbs", "lbs-fair-off")),
    "sleep-100": (250, 0.005, ("lbs", "lbs-fair-off")),
}


def _numbers(env: str, default: list[int]) -> list[int]:
    raw = os.environ.get(env, "")
    return [int(x) for x in raw.split(",") if x.strip()] if raw.strip() else default


def fleet_sizes() -> list[int]:
    spare = cores() - 2
    return _numbers(
        "LBS_FLEET_CONSUMERS", [1, 2, 4] + [k for k in (8, 12, 16, 24, 32) if k <= spare]
    )


def rates() -> list[int]:
    return _numbers("LBS_FLEET_RATES", [500, 2_000, 10_000] + ([40_000] if cores() >= 8 else []))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # With timing off (make test), one small fleet runs every side once, so none can rot.
    small = metafunc.config.getoption("benchmark_disable", False)
    ks = [2] if small else fleet_sizes()
    rs = [500] if small else rates()
    name = metafunc.function.__name__
    if name == "bench_fleet_steady":
        cases: list[Any] = [(s, k, r) for k in ks for r in rs for s in STEADY_SIDES]
        ids = [f"{s}-{k}x-{r}/s" for s, k, r in cases]
        metafunc.parametrize("side, consumers, rate", cases, ids=ids)
    elif name == "bench_fleet_drain":
        cases = [(s, k) for k in ks for s in STEADY_SIDES]
        metafunc.parametrize("side, consumers", cases, ids=[f"{s}-{k}x" for s, k in cases])
    elif name == "bench_fleet_fair":
        many = [k for k in ks if k >= 2]
        cases = [(s, k, h) for k in many for h, (_, _, sides) in FAIR.items() for s in sides]
        ids = [f"{s}-{k}x-{h}" for s, k, h in cases]
        metafunc.parametrize("side, consumers, handler", cases, ids=ids)


def _record(bench: Bench, result: Result, baseline: bool, label: str) -> None:
    info = bench.extra_info
    info["baseline"] = baseline
    info["fixed_duration"] = True
    info.update(result.figures())
    info["label"] = label  # what the report prints


def bench_fleet_steady(bench: Bench, side: str, consumers: int, rate: int) -> None:
    bench.benchmark.group = f"fleet: {consumers} consumers, {rate:,}/s steady, no-op handler"
    seconds = 0.5 if bench.benchmark.disabled else SECONDS
    results: list[Result] = []

    async def measured(service: str) -> None:
        results.append(
            await run_fleet(bench.url, service, side, consumers, rate=rate, seconds=seconds)
        )

    bench(measured, setup=lambda: bench.service(f"fleet-{side}"), rounds=1)
    (result,) = results
    assert result.handled > 0
    _record(bench, result, side == BASELINE, LABELS[side])


async def _backlog(bench: Bench, side: str, service: str, n: int) -> None:
    """Register ``n`` (every side's group is created at id 0, so the fleet reads them all)."""
    closeable, publish = publisher(side, bench.url, service)
    try:
        for at in range(0, n, 2_000):
            await publish([(f"s{i}", {"n": i}) for i in range(at, min(n, at + 2_000))])
    finally:
        close = getattr(closeable, "aclose", None) or closeable.close
        await close()


def bench_fleet_drain(bench: Bench, side: str, consumers: int) -> None:
    n = 1_000 if bench.benchmark.disabled else BACKLOG
    bench.benchmark.group = f"fleet: {consumers} consumers, a backlog of {n:,} drained"
    results: list[Result] = []

    async def setup() -> str:
        service = bench.service(f"drain-{side}")
        await _backlog(bench, side, service, n)
        return service

    async def measured(service: str) -> None:
        results.append(await run_fleet(bench.url, service, side, consumers, backlog=n))

    bench(measured, setup=setup, rounds=1)
    (result,) = results
    assert result.handled == n, (result.handled, n)
    _record(bench, result, side == BASELINE, LABELS[side])


def bench_fleet_fair(bench: Bench, side: str, consumers: int, handler: str) -> None:
    per, tick, sides = FAIR[handler]
    rate = per * consumers
    sent = f"bursts of {rate:,} once a second" if tick >= 1 else f"{rate:,}/s steady"
    how = (
        f"holds its process {handler[6:]} ms"
        if handler.startswith("block")
        else f"awaits {handler[6:]} ms"
    )
    bench.benchmark.group = f"fleet: {consumers} consumers, {sent}, the handler {how}"
    seconds = 0.5 if bench.benchmark.disabled else SECONDS
    results: list[Result] = []

    async def measured(service: str) -> None:
        results.append(
            await run_fleet(
                bench.url,
                service,
                side,
                consumers,
                handler=handler,
                rate=rate,
                seconds=seconds,
                tick=tick,
                grace=3.0,
            )
        )

    bench(measured, setup=lambda: bench.service(f"fair-{side}"), rounds=1)
    (result,) = results
    assert result.handled > 0
    _record(bench, result, side == sides[0] == BASELINE, LABELS[side])
