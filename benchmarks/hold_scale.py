"""Holding at scale: ``python -m benchmarks.hold_scale [--streams 1000000]``.

One process (a subprocess, so that its memory is its own) holds ``--streams`` data streams under
one lease: an ``lbs.Client`` of the notification API (``Config()`` defaults but room to hold
everything: ``max_streams`` and ``notification_buffer``), every stream read and queued, none
taken. It reports:

* its resident memory per held stream: the process's RSS once everything is held (after a
  ``gc.collect()``) less its RSS once started holding nothing, divided by the streams; this counts
  everything lbs keeps per held stream: the held table and the queued notifications;
* what a heartbeat tick costs Redis holding them, and holding one stream (a second client of
  another service in the same process, the same server): ``INFO cpu`` and ``INFO commandstats``
  over 20 ticks each, and the client's CPU per tick.

The issue 44 target: a tick holding 1,000,000 streams costs Redis what one held stream's does, at
no more than 500 bytes of client memory per held stream. Needs the redis-server of
``LBS_REDIS_SERVER`` (or on PATH); registering a million streams takes Redis about 1.5 GB.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

import redis.asyncio as aioredis

import lbs
from lbs.embedded import RedisServer

TICKS = 20


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _redis_cost(r: aioredis.Redis, tick: Any) -> dict[str, Any]:
    """Redis's CPU (µs) and commands per tick over TICKS ticks, and the client's CPU per tick."""
    await r.config_resetstat()
    cpu0 = await r.info("cpu")
    own0 = time.process_time()
    for _ in range(TICKS):
        await tick()
    own = (time.process_time() - own0) / TICKS
    cpu1, stats = await r.info("cpu"), await r.info("commandstats")
    used = sum(cpu1[k] - cpu0[k] for k in ("used_cpu_sys", "used_cpu_user"))
    commands = {
        k.removeprefix("cmdstat_"): [v["calls"] / TICKS, round(v["usec"] / TICKS, 1)]
        for k, v in stats.items()
        if k not in ("cmdstat_info", "cmdstat_config|resetstat")
    }
    return {
        "redis_cpu_us_per_tick": round(used * 1e6 / TICKS, 1),
        "commands_per_tick": commands,
        "client_cpu_ms_per_tick": round(own * 1000, 2),
    }


async def _worker(url: str, streams: int) -> dict[str, Any]:
    cfg = lbs.Config(max_streams=streams, notification_buffer=streams + 16)
    big = lbs.Client(url, "hold", "holder", cfg, load_entrypoint_plugins=False)
    small = lbs.Client(url, "hold-one", "holder", lbs.Config(), load_entrypoint_plugins=False)
    r = aioredis.Redis.from_url(url)
    async with small:
        await big.start()
        try:
            gc.collect()
            rss0 = _rss()
            started = time.monotonic()
            while big.held < streams:
                await asyncio.sleep(0.2)
            held_in = time.monotonic() - started
            gc.collect()
            rss1 = _rss()
            while small.held < 1:
                await asyncio.sleep(0.05)
            await big.heartbeat()  # the first tick reads the server's clock (extend-n.lua on 7.x)
            await small.heartbeat()
            out = {
                "streams": streams,
                "held_in_s": round(held_in, 1),
                "rss_bytes_per_held_stream": round((rss1 - rss0) / streams),
                "tick_holding_all": await _redis_cost(r, big.heartbeat),
                "tick_holding_one": await _redis_cost(r, small.heartbeat),
            }
        finally:
            await big.close()
            await r.aclose()
    return out


async def main(streams: int) -> dict[str, Any]:
    with RedisServer() as server:
        async with lbs.Producer(server.url, "hold") as p:
            for i in range(0, streams, 10_000):
                await p.add_streams([f"s-{j}" for j in range(i, min(i + 10_000, streams))])
        async with lbs.Producer(server.url, "hold-one") as p:
            await p.add_streams(["only"])
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.hold_scale", "--worker", server.url, str(streams)],
            capture_output=True,
            text=True,
            check=True,
            timeout=3600,
        )
    return dict(json.loads(proc.stdout.splitlines()[-1]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        print(json.dumps(asyncio.run(_worker(sys.argv[2], int(sys.argv[3])))))
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1_000_000)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(main(args.streams)), indent=2))
