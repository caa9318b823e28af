"""Recovery at scale: ``python -m benchmarks.recovery_scale [--streams 100000] [--ttl 10] [--rescuers 2]``.

One process holds ``--streams`` data streams (read and queued by a client of the notification API)
and is killed with SIGKILL. ``--rescuers`` consumers with the default ``Config`` (but the TTL, and
room to hold everything) run in this process: their recovery finds the dead holder's work and
their readers take it again. For every stream the time from the kill to its re-delivery (the
STREAM_ADDED a rescuer hands out) is recorded; the script prints p50 / p99 / max beside the lease
TTL (the target: p99 <= TTL + 1 s), how many came back, twice, or with a retry counted, and the p99
counted from the moment the holder's lease expired (its last heartbeat + TTL: up to one heartbeat
interval before kill + TTL), which does not depend on when in its heartbeat cycle the holder died.

``bench_recovery.py`` runs it once, small, so it cannot rot.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from typing import Any

import redis.asyncio as aioredis

import lbs
from lbs._keys import consumers_key
from lbs.embedded import RedisServer


def _worker(url: str, service: str, streams: int, ttl: float) -> None:
    """The doomed holder: hold every stream (queued, never taken), say so, wait to be killed."""

    async def main() -> None:
        cfg = lbs.Config(lock_ttl=ttl, max_streams=streams, notification_buffer=streams + 16)
        client = lbs.Client(url, service, "doomed", cfg, load_entrypoint_plugins=False)
        await client.start()
        while client.held < streams:
            await asyncio.sleep(0.05)
        print("held", client.id, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


async def main(streams: int, ttl: float, rescuers: int, quiet: bool = False) -> dict[str, Any]:
    """Run one kill and return the figures (latencies sorted, seconds from the kill)."""
    service = "scale"
    with RedisServer() as server:
        r = aioredis.Redis.from_url(server.url)
        async with lbs.Producer(server.url, service) as p:
            for i in range(0, streams, 10_000):
                await p.add_streams([f"s-{j}" for j in range(i, min(i + 10_000, streams))])
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.recovery_scale",
                "--worker",
                server.url,
                service,
                str(streams),
                str(ttl),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        seen: dict[str, float] = {}
        closing = False
        twice = retried = 0
        clients = [
            lbs.Client(
                server.url,
                service,
                f"rescuer-{i}",
                lbs.Config(lock_ttl=ttl, max_streams=streams, notification_buffer=streams + 16),
                load_entrypoint_plugins=False,
            )
            for i in range(rescuers)
        ]
        killed = 0.0

        async def collect(c: lbs.Client) -> None:
            nonlocal twice, retried
            while (note := await c.next_notification()) is not None:
                batch = [note, *c.drain_notifications()]
                now = time.monotonic()
                for n in batch:
                    if n.type is not lbs.NotificationType.STREAM_ADDED:
                        continue
                    if closing:
                        return  # a closing rescuer hands its streams back: the others take them again
                    if n.stream in seen:
                        twice += 1
                    seen[n.stream] = now - killed
                    retried += n.retry_count > 0

        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 600)
            assert line.startswith("held "), line
            doomed = line.split()[1]
            for c in clients:
                await c.start()
            tasks = [asyncio.create_task(collect(c)) for c in clients]
            await r.config_resetstat()
            cpu0 = await r.info("cpu")
            own0 = time.process_time()
            proc.kill()
            killed = time.monotonic()
            # When the dead holder's lease expires: its last heartbeat's deadline, against the server's clock.
            server_now, deadline_ms = await r.time(), await r.zscore(consumers_key(service), doomed)
            expiry = (
                (deadline_ms - (server_now[0] * 1000 + server_now[1] / 1000)) / 1000
                if deadline_ms
                else 0.0
            )
            deadline = killed + ttl + 120
            while len(seen) < streams and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            own1 = time.process_time()
            cpu1, stats = await r.info("cpu"), await r.info("commandstats")
        finally:
            closing = True
            proc.kill()
            proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
            for c in clients:
                await c.close()
            await r.aclose()
        for t in tasks:
            await t
    lat = sorted(seen.values())
    out = {
        "streams": streams,
        "back": len(lat),
        "twice": twice,
        "retried": retried,
        "ttl": ttl,
        "p50": statistics.median(lat) if lat else float("nan"),
        "p99": _quantile(lat, 0.99) if lat else float("nan"),
        "max": lat[-1] if lat else float("nan"),
        "version": server.version,
        "first": lat[0] if lat else float("nan"),
        "expiry": expiry,
        "p99_after_expiry": (_quantile(lat, 0.99) - expiry) if lat else float("nan"),
        "client_cpu_s": own1 - own0,
        "redis_cpu_s": sum(cpu1[k] - cpu0[k] for k in ("used_cpu_sys", "used_cpu_user")),
        "top": sorted(
            ((v["usec"], k.removeprefix("cmdstat_"), v["calls"]) for k, v in stats.items()),
            reverse=True,
        )[:6],
    }
    if not quiet:
        print(
            f"Redis {'.'.join(map(str, server.version))}; one process held {streams:,} streams, killed -9; "
            f"{rescuers} rescuers (default Config, lock_ttl {ttl:g} s)"
        )
        print(
            f"back {out['back']:,}/{streams:,}, twice {twice}, with a retry counted {retried}; from the kill: "
            f"p50 {out['p50']:.2f} s, p99 {out['p99']:.2f} s, max {out['max']:.2f} s "
            f"(target p99 <= {ttl + 1:g} s)"
        )
        print(
            f"the lease expired {expiry:.2f} s after the kill (the holder's last heartbeat + TTL); first back "
            f"{out['first']:.2f} s after the kill; p99 {out['p99_after_expiry']:.2f} s after the lease expired; "
            f"CPU of the rescuers' process {out['client_cpu_s']:.2f} s"
        )
        print(
            f"Redis CPU from the kill until all were back: {out['redis_cpu_s']:.2f} s "
            f"({out['redis_cpu_s'] / max(1, len(lat)) * 1e6:.0f} us per stream); most: "
            + ", ".join(
                f"{name} {usec / 1e6:.2f} s in {calls:,} calls" for usec, name, calls in out["top"]
            )
        )
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=100_000)
    ap.add_argument("--ttl", type=float, default=10.0)
    ap.add_argument("--rescuers", type=int, default=2)
    args = ap.parse_args()
    asyncio.run(main(args.streams, args.ttl, args.rescuers))
