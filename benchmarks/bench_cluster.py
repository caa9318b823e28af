"""Fleets on a Redis Cluster: K consumer processes, M masters, N shards, beside one Redis, in one run.

Every row runs K consumer *processes* (:mod:`benchmarks.fleet`: ``lbs.ShardedClient(url, service,
"c<i>", lbs.Config(), shards=N)`` with the installed plugins, ``run()`` with a no-op handler) on a
service whose name is drawn at random (:func:`benchmarks.data.service_name`): placement
(:mod:`lbs._placement`) puts N / M shards on each master whatever the name. The baseline row of
each group is lbs on one Redis (not a cluster), unsharded, with the same K in the same run.

* **Backlog** (``bench_cluster_drain``): :data:`BACKLOG` registrations (``Producer(..., shards=N)``)
  wait when the fleet starts; the window closes when every one has started: ``handled_per_s`` is the
  fleet's drain rate.
* **Steady** (``bench_cluster_steady``): producer processes send :func:`rate` registrations a
  second for :data:`SECONDS`; ``p50_ms``/``p99_ms`` from send to handler start.

Sizes come from the cores at run time (:func:`benchmarks.fleet.cores`): masters 1 (one Redis) and 3,
then 6 and 8 where there are five cores per master; K = the cores left by the largest M and one
producer (at least 2); N = M, 2M and 4M. ``LBS_CLUSTER_MASTERS``, ``LBS_CLUSTER_CONSUMERS``,
``LBS_FLEET_BACKLOG`` (25,000 per core, at least 50,000), ``LBS_CLUSTER_RATE`` and
``LBS_FLEET_SECONDS`` override them. Every master, consumer and producer shares the machine's
cores: on a machine with fewer cores than M + K + 1 the rows show the load spreading, not the
speed-up (docs/benchmarks.md).

``extra_info`` as in :mod:`benchmarks.bench_fleet`, plus ``masters``, ``shards``, ``redis_cpu_pct``
(every master together, % of one core) and ``per_master`` (``{port: [Redis CPU %, evalsha/s,
xreadgroup/s]}``). With ``--benchmark-disable`` (``make test``): 2 consumers, M = 1 and 3, N = M,
a backlog of 1,000 and 500/s for 0.5 s.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis

from lbs.embedded import RedisClusterServers

from .data import cleanup_node
from .fleet import Result, cores, publisher, run_fleet

if TYPE_CHECKING:
    from .conftest import Bench

SECONDS = float(os.environ.get("LBS_FLEET_SECONDS", "10"))


def _numbers(env: str, default: list[int]) -> list[int]:
    raw = os.environ.get(env, "")
    return [int(x) for x in raw.split(",") if x.strip()] if raw.strip() else default


def masters() -> list[int]:
    """1 (one Redis, the baseline) and 3; 6 and 8 where there are five cores per master."""
    return _numbers("LBS_CLUSTER_MASTERS", [1, 3] + [m for m in (6, 8) if 5 * m <= cores()])


def consumers() -> int:
    """K: the cores left by the largest M and a producer, at least 2."""
    return _numbers("LBS_CLUSTER_CONSUMERS", [max(2, cores() - max(masters()) - 1)])[0]


def backlog() -> int:
    return int(os.environ.get("LBS_FLEET_BACKLOG", str(max(50_000, 25_000 * cores()))))


def rate() -> int:
    """The steady rate: 2,500 a second per core (5,000 on 2 cores)."""
    return int(os.environ.get("LBS_CLUSTER_RATE", str(2_500 * cores())))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    small = metafunc.config.getoption("benchmark_disable", False)
    ms = [1, 3] if small else masters()
    cases = [(m, n) for m in ms for n in ([m] if small else [m, 2 * m, 4 * m])]
    if 1 in ms and (1, 1) not in cases:
        cases.insert(0, (1, 1))
    metafunc.parametrize("masters, shards", cases, ids=[f"M={m}-N={n}" for m, n in cases])


@pytest.fixture(scope="module")
def clusters(request: pytest.FixtureRequest) -> Iterator[Callable[[int], RedisClusterServers]]:
    """A cluster of M masters, started once per M (3: the session's ``redis_cluster``)."""
    started: dict[int, RedisClusterServers] = {}

    def get(m: int) -> RedisClusterServers:
        if m == 3:
            cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
            return cluster
        if m not in started:
            config = {"notify-keyspace-events": "Kx"}
            started[m] = RedisClusterServers(masters=m, config=config).start()
        return started[m]

    try:
        yield get
    finally:
        for c in started.values():
            c.stop()


def _where(
    bench: Bench, clusters: Callable[[int], RedisClusterServers], m: int
) -> tuple[str, list[str]]:
    """The URL the fleet is given and the URLs of the servers whose cost is taken."""
    if m == 1:
        return bench.url, [bench.url]
    cluster = clusters(m)
    first = cluster.nodes[0]
    return f"redis+cluster://{first.host}:{first.port}", [n.url for n in cluster.masters]


def _record(bench: Bench, result: Result, m: int, n: int, servers: list[str]) -> None:
    info: dict[str, Any] = bench.extra_info
    info["baseline"] = m == 1 and n == 1
    info["fixed_duration"] = True
    info["label"] = (
        "lbs, one Redis, unsharded" if m == 1 and n == 1 else f"lbs, {m} masters, {n} shards"
    )
    info["masters"], info["shards"] = m, n
    info.update(result.figures())
    per_master = {}
    for url, c in zip(servers, result.costs):
        calls = {cmd: v[0] for cmd, v in c.commands.items()}
        per_master[url.rsplit(":", 1)[-1]] = [
            round(c.cpu / c.seconds * 100, 1),
            round(calls.get("evalsha", 0) / c.seconds),
            round(calls.get("xreadgroup", 0) / c.seconds),
        ]
    info["per_master"] = per_master


async def _cleanup(servers: list[str], service: str) -> None:
    for url in servers:
        r = aioredis.Redis.from_url(url)
        try:
            await cleanup_node(r, service)
        finally:
            await r.aclose()


def bench_cluster_drain(
    bench: Bench, clusters: Callable[[int], RedisClusterServers], masters: int, shards: int
) -> None:
    k = 2 if bench.benchmark.disabled else consumers()
    total = bench.size(backlog(), 1_000)
    bench.benchmark.group = f"cluster fleet: {k} consumer processes, a backlog of {total:,} drained"
    url, servers = _where(bench, clusters, masters)
    side = f"sharded-{shards}"
    results: list[Result] = []

    async def setup() -> str:
        service = bench.service("cluster")  # drawn at random
        bench.defer(_cleanup, servers, service)
        closeable, publish = publisher(side, url, service)
        try:
            for at in range(0, total, 2_000):
                await publish([(f"s{i}", {"n": i}) for i in range(at, min(total, at + 2_000))])
        finally:
            await closeable.close()
        return service

    async def measured(service: str) -> None:
        results.append(await run_fleet(url, service, side, k, backlog=total, servers=servers))

    bench(measured, setup=setup, rounds=1)
    (result,) = results
    assert result.handled == total, (result.handled, total)
    _record(bench, result, masters, shards, servers)


def bench_cluster_steady(
    bench: Bench, clusters: Callable[[int], RedisClusterServers], masters: int, shards: int
) -> None:
    k = 2 if bench.benchmark.disabled else consumers()
    per_s = bench.size(rate(), 500)
    bench.benchmark.group = f"cluster fleet: {k} consumer processes, {per_s:,}/s steady"
    url, servers = _where(bench, clusters, masters)
    seconds = bench.size(SECONDS, 0.5)
    results: list[Result] = []

    def setup() -> str:
        service = bench.service("cluster")
        bench.defer(_cleanup, servers, service)
        return service

    async def measured(service: str) -> None:
        results.append(
            await run_fleet(
                url, service, f"sharded-{shards}", k, rate=per_s, seconds=seconds, servers=servers
            )
        )

    bench(measured, setup=setup, rounds=1)
    (result,) = results
    assert result.handled > 0
    _record(bench, result, masters, shards, servers)
