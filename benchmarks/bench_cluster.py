"""Assignments/s on the 3-master Redis Cluster with 1, 3 and 6 LBS shards, in one run.

Each round registers CYCLE_N data streams (set-up, outside the timing) and
drains them with one consumer process, ``ShardedClient.run`` with a no-op
handler. ``extra_info`` holds the EVALSHA and XADD calls each master served
(INFO commandstats, differences over the round): with one shard one master
does all the work; with 3 and 6 the shards' slots spread it over the masters.

On this 2-core machine the three masters, the client and the producer share
two cores, so the absolute numbers say little; the shape (how the load
spreads) is the point. See docs/benchmarks.md ("Redis Cluster, sharded") for
the scaling model.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
import redis

import lbs
from lbs.embedded import RedisClusterServers

from .data import service_name as _service

if TYPE_CHECKING:
    from .conftest import Bench

CYCLE_N = 6_000
CHUNK = 1_000


def _spread(cluster: RedisClusterServers, tag: str, shards: int) -> str:
    """A service name whose shards fall on as many masters as they can (all, from 3 shards)."""
    want = min(shards, len(cluster.masters))
    with cluster.client() as c:
        while True:
            service = _service(tag)
            owners = {
                c.get_node_from_key(lbs.input_stream(s)).name
                for s in lbs.shard_services(service, shards)
            }
            if len(owners) == want:
                return service


def _calls(cluster: RedisClusterServers) -> dict[str, dict[str, int]]:
    out = {}
    for node in cluster.masters:
        with redis.Redis(host=node.host, port=node.port) as r:
            stats = r.info("commandstats")
        out[f"{node.port}"] = {
            cmd: int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0)) for cmd in ("evalsha", "xadd")
        }
    return out


async def _register(url: str, service: str, shards: int) -> None:
    async with lbs.Producer(url, service, shards=shards) as p:
        names = [f"s{i}" for i in range(CYCLE_N)]
        for i in range(0, CYCLE_N, CHUNK):
            await p.add_streams(names[i : i + CHUNK])


async def _drain(url: str, service: str, shards: int) -> int:
    cfg = lbs.Config(
        read_block=0.05,
        configure_keyspace_events=False,
        lock_ttl=60.0,
        max_streams=CHUNK * shards,
        read_count=CHUNK // 2,
    )
    c = lbs.ShardedClient(url, service, "bench", cfg, shards=shards, load_entrypoint_plugins=False)

    async def noop(note: lbs.Notification) -> None:
        return None

    runner = asyncio.create_task(c.run(noop))
    while sum(s.stats.finished for s in c.clients) < CYCLE_N:
        await asyncio.sleep(0.005)
    finished = sum(s.stats.finished for s in c.clients)
    await c.close()
    await runner
    return finished


@pytest.mark.benchmark(group=f"assignment cycle on a 3-master cluster, {CYCLE_N} streams")
@pytest.mark.parametrize("shards", [1, 3, 6])
def bench_cluster_shards(bench: Bench, redis_cluster: RedisClusterServers, shards: int) -> None:
    url = f"redis+cluster://{redis_cluster.nodes[0].host}:{redis_cluster.nodes[0].port}"
    rounds: list[dict[str, dict[str, int]]] = []

    def setup() -> str:
        # A name on the cluster (bench.service's are the single server's); its keys stay there.
        service = _spread(redis_cluster, "cluster", shards)
        before = _calls(redis_cluster)
        bench.run(_register(url, service, shards))
        rounds.append(before)
        return service

    def measured(service: str) -> int:
        done = bench.run(_drain(url, service, shards))
        after, before = _calls(redis_cluster), rounds[-1]
        rounds[-1] = {n: {k: after[n][k] - before[n][k] for k in after[n]} for n in after}
        return done

    assert bench(measured, setup=setup) == CYCLE_N
    bench.extra_info["calls_per_master_last_round"] = rounds[-1]
    busy = [n for n, c in rounds[-1].items() if c["evalsha"] > 0]
    assert len(busy) == min(shards, 3)  # the load spread over as many masters as shards allow
