"""Recovery latency, per path: ``python -m benchmarks.recovery_latency [--trials 20] [--ttl 1.0] [--noise 10000]
[--cluster] [--paths deadline,keyspace]``.

For each trial a consumer process takes a stream and is killed with SIGKILL;
the time from the kill to the stream being back (the rescuer's STREAM_EXPIRED
when it re-queues it into the LBS under a new id, or STREAM_ADDED when it takes
the copy, whichever it hears first) is
measured on a rescuer that runs one recovery path only:

* ``deadline``: the deadline poller (keyspace listener off);
* ``keyspace``: the keyspace listener (deadline poller off).

The database holds ``--noise`` (10,000) unrelated keys with TTLs and a live
consumer holding as many streams (under its one lease: no key per stream), as
in the issue's target (p99 <= TTL + 1 s). Latency from the kill includes the
dead holder's remaining lease TTL, at most TTL.
``--cluster`` runs it on a 3-master Redis Cluster (the noise spread over the
masters; every client reaches the service's slot owner through a URL of
another node). ``bench_recovery.py`` runs it once, small, so it cannot rot.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

import lbs
from lbs.embedded import RedisClusterServers, RedisServer

WORKER = str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "_worker.py")


async def trial(url: str, service: str, ttl: float, path: str) -> float:
    async with lbs.Producer(url, service) as p:
        await p.add_stream("victim")
    proc = subprocess.Popen(
        [sys.executable, WORKER, url, service, "doomed", str(ttl), "3600", "norecovery"],
        stdout=subprocess.PIPE,
        text=True,
    )
    cfg = dict(lock_ttl=ttl, read_block=0.1, max_streams=1)
    if path == "deadline":
        cfg.update(keyspace_recovery=False, deadline_poll_interval=0.1)
    else:
        cfg.update(deadline_poll_interval=3600.0)
    rescuer = lbs.Client(url, service, "rescuer", lbs.Config(**cfg), load_entrypoint_plugins=False)  # type: ignore[arg-type]
    try:
        assert proc.stdout is not None
        await asyncio.to_thread(proc.stdout.readline)
        await rescuer.start()
        if path == "keyspace":
            await asyncio.wait_for(rescuer.recovery.listening.wait(), 10)
        proc.kill()
        killed = time.monotonic()
        async for note in rescuer.notifications():
            if note.type in (
                lbs.NotificationType.STREAM_EXPIRED,
                lbs.NotificationType.STREAM_ADDED,
            ):
                return time.monotonic() - killed
        raise RuntimeError("rescuer closed")
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        await rescuer.close()


async def main(
    trials: int,
    ttl: float,
    noise: int = 10_000,
    cluster: bool = False,
    paths: tuple[str, ...] = ("deadline", "keyspace"),
) -> dict[str, list[float]]:
    """Print and return the sorted latencies of each path."""
    results: dict[str, list[float]] = {}
    config = {"notify-keyspace-events": "Kx"}
    with (
        RedisClusterServers(masters=3, config=config) if cluster else RedisServer(config=config)
    ) as server:
        url = (
            f"redis+cluster://{server.nodes[-1].host}:{server.nodes[-1].port}"
            if cluster
            else server.url
        )
        r: Any = (
            RedisCluster(host=server.nodes[-1].host, port=server.nodes[-1].port)
            if cluster
            else aioredis.Redis.from_url(server.url)
        )
        version = server.nodes[0].version if cluster else server.version
        pipe = r.pipeline(transaction=False)
        for i in range(noise):
            pipe.set(f"noise:{i}", "x", ex=3600)
        await pipe.execute()
        async with lbs.Producer(r, "live") as p:
            await p.add_streams([f"live-{i}" for i in range(noise)])
        live = lbs.Client(
            r,
            "live",
            "live",
            lbs.Config(
                max_streams=max(1, noise),
                read_count=max(1, noise),
                notification_buffer=noise + 1,
                lock_ttl=ttl,
            ),
            load_entrypoint_plugins=False,
        )
        await live.start()
        while live.held < noise:
            await asyncio.sleep(0.05)
        print(
            f"Redis {'.'.join(map(str, version))}{' Cluster, 3 masters' if cluster else ''}; {noise:,} volatile "
            f"keys, {noise:,} streams held by a live consumer; lease TTL {ttl} s; {trials} trials per path"
        )
        for path in paths:
            lat = sorted([await trial(url, f"lat-{path}-{i}", ttl, path) for i in range(trials)])
            results[path] = lat
            p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
            print(
                f"{path:9s} p50 {statistics.median(lat):.3f} s  p99 {p99:.3f} s  max {lat[-1]:.3f} s  "
                f"(target <= {ttl + 1:.1f} s)"
            )
        await live.close()
        await r.aclose()
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--ttl", type=float, default=1.0)
    ap.add_argument(
        "--noise",
        type=int,
        default=10_000,
        help="volatile keys, and streams held by a live consumer, beside the victim",
    )
    ap.add_argument("--cluster", action="store_true", help="on a 3-master Redis Cluster")
    ap.add_argument(
        "--paths", default="deadline,keyspace", help="comma-separated: deadline, keyspace"
    )
    args = ap.parse_args()
    asyncio.run(main(args.trials, args.ttl, args.noise, args.cluster, tuple(args.paths.split(","))))
