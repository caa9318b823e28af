"""``lbs bench``: the assignment cycle of ``make bench`` (lbs ``run()`` against plain redis-py) on a given Redis."""

from __future__ import annotations

import asyncio
import platform
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Annotated

import redis.asyncio as aioredis
import typer
from redis.exceptions import RedisError
from rich import box
from rich.console import Console
from rich.table import Table

from .. import __version__, _bench
from .._admin import glob_escape
from .._redis.connection import open_plain, server_name
from ..exceptions import LbsError
from ._common import EXIT_FAILURE, err_console, explain, fail, mask_url

__all__ = ["bench"]

#: The two sides, in the order they run: what ``make bench`` calls them.
SIDES: dict[str, _bench.Cycle] = {
    "lbs run()": _bench.cycle_lbs_run,
    "redis-py batched + Lua": _bench.cycle_redis_py_batched_lua,
}


@dataclass
class Side:
    """One side's rounds: wall seconds, and client and Redis CPU seconds."""

    name: str
    times: list[float] = field(default_factory=list)
    cpu: list[tuple[float, float]] = field(default_factory=list)

    def stddev(self) -> float:
        return statistics.stdev(self.times) if len(self.times) > 1 else 0.0


async def _service_keys(r: aioredis.Redis, service: str) -> list[bytes]:
    """Keys whose name contains ``service`` (every key of it and of the rounds' services)."""
    return [k async for k in r.scan_iter(match=f"*{glob_escape(service)}*", count=10_000)]


async def _run(
    url: str, service: str, streams: int, rounds: int, force: bool
) -> tuple[list[Side], str]:
    r = open_plain(url)
    try:
        server = " ".join(server_name(await r.info("server")))  # "Valkey 9.1.2", "Redis 8.6.3"
        existing = await _service_keys(r, service)
        if existing and not force:
            fail(
                "bench",
                f"{mask_url(url)} already has {len(existing)} key(s) of service {service!r} "
                f"(e.g. {existing[0].decode(errors='replace')}): pass --force to run anyway, "
                "or --service NAME",
            )
        sides: list[Side] = []
        for name, cycle in SIDES.items():
            side = Side(name)
            for n in range(rounds):
                run_service = f"{service}-{len(sides)}-{n}-{uuid.uuid4().hex[:6]}"
                try:
                    await _bench.register(r, run_service, streams)  # set-up, outside the timing
                    started = time.perf_counter()
                    done, client_cpu, server_cpu = await _bench.measure(
                        cycle, r, run_service, streams
                    )
                    side.times.append(time.perf_counter() - started)
                finally:
                    keys = await _service_keys(r, run_service)
                    if keys:
                        await r.unlink(*keys)
                if done != streams:
                    fail("bench", f"{name} finished {done} of {streams} streams")
                side.cpu.append((client_cpu, server_cpu))
                err_console.print(
                    f"{name}: round {n + 1}/{rounds} {side.times[-1]:.3f} s", highlight=False
                )
            sides.append(side)
        return sides, server
    finally:
        await r.aclose()


def _scale(seconds: float) -> tuple[float, str]:
    """A unit for a column of durations, as pytest-benchmark picks one: by the smallest value."""
    for factor, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "us")):
        if seconds * factor >= 1:
            return factor, unit
    return 1e9, "ns"


def table(sides: list[Side], streams: int) -> Table:
    """pytest-benchmark's columns (min, max, mean, stddev, median, rounds) and its extra_info, per side."""
    factor, unit = _scale(min(min(s.times) for s in sides))
    t = Table(
        title=f"assignment cycle, {streams} streams (times in {unit})",
        title_justify="left",
        caption="per s: assignments per second at the median; client µs, Redis µs: CPU per assignment in "
        "the best round (extra_info's client_cpu_us_per_assignment, redis_cpu_us_per_assignment; "
        "Redis's from INFO cpu, every client of the server included)",
        caption_justify="left",
        box=box.SIMPLE_HEAVY,
        pad_edge=False,
    )
    t.add_column("Name", no_wrap=True)
    for column in (
        "Min",
        "Max",
        "Mean",
        "StdDev",
        "Median",
        "Rounds",
        "per s",
        "client µs",
        "Redis µs",
    ):
        t.add_column(column, justify="right", no_wrap=True)
    for s in sides:
        client_cpu, server_cpu = min(s.cpu)  # the best round's, as the benchmark records them
        median = statistics.median(s.times)
        values = (min(s.times), max(s.times), statistics.mean(s.times), s.stddev(), median)
        t.add_row(
            s.name,
            *(f"{v * factor:.4f}" for v in values),
            str(len(s.times)),
            f"{streams / median:,.0f}",
            f"{client_cpu / streams * 1e6:.2f}",
            f"{server_cpu / streams * 1e6:.2f}",
        )
    return t


def bench(
    url: Annotated[
        str,
        typer.Option(
            envvar="LBS_URL",
            show_default=False,
            help="The Redis to measure on (written to: the rounds' keys are deleted after).",
        ),
    ],
    streams: Annotated[int, typer.Option(min=1, help="Data streams per round.")] = _bench.CYCLE_N,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds per side.")] = 3,
    service: Annotated[
        str,
        typer.Option(
            help="Prefix of the rounds' service names (`<service>-<side>-<round>-<random>`)."
        ),
    ] = "lbs-bench",
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Run even if the Redis already has keys whose name contains the service name.",
        ),
    ] = False,
) -> None:
    """Time the assignment cycle (read and take, no-op handler, done): lbs run() against the plain
    redis-py batched + Lua loop (a lock key per entry), as make bench does
    (benchmarks/bench_client.py::bench_assignment_cycle).

    Each round registers --streams data streams (set-up, not timed) and consumes them. Prints the
    timings per side (the columns of pytest-benchmark's table), client and Redis CPU per assignment
    (Redis's from INFO cpu: other clients of that server count too), and how lbs compares.
    Exit codes: 0 done; 1 Redis unreachable, or it already has keys of the service (see --force);
    2 a usage error.
    """
    try:
        sides, server = asyncio.run(_run(url, service, streams, rounds, force))
    except (RedisError, OSError, LbsError) as exc:
        said = explain(exc, url)  # cannot connect, a password, TLS: with the fix
        shown = said if said != str(exc) else f"{mask_url(url)}: {type(exc).__name__}: {exc}"
        fail("bench", shown, EXIT_FAILURE)
    console = Console()
    result = table(sides, streams)
    wide = console.measure(result, options=console.options.update(max_width=1_000)).maximum
    if wide > console.width:  # as pytest-benchmark's table: wider than the terminal rather than cut
        console = Console(width=wide)
    console.print(result)
    lbs_side, base = sides
    ratio = statistics.median(base.times) / statistics.median(lbs_side.times)
    console.print(
        f"{lbs_side.name}: {ratio:.2f}x the throughput of {base.name} (by median); "
        f"lbs {__version__}, redis-py {version('redis')}, hiredis {version('hiredis')}, "
        f"Python {platform.python_version()}, {server} at {mask_url(url)}",
        highlight=False,
        soft_wrap=True,
    )
    sys.stdout.flush()
