"""What a shard costs when idle: one ``lbs.ShardedClient`` with 1, 6 and 24 shards, nothing registered.

One ``lbs.ShardedClient(url, service, "idle", lbs.Config(), shards=n)`` with the installed plugins
(as an application gets them), started (every shard's reader, heartbeat, recovery, delays, controls
and observer running) in this process, on one Redis and on the embedded 3-master cluster
(``redis_cluster``; the service name drawn at random: placement puts n / 3 shards on each master).

Each row, one round, on every master: Redis alone over a window (:data:`WINDOW`, 20 s); the client
started, warmed up 3 s and measured over a window of the same length (INFO cpu and commandstats,
:class:`benchmarks.cost.Window`, and this process's CPU); then a MONITOR window of the same length
that names the activity behind each command by its key (:func:`activity`); then Redis alone
again. Redis CPU is the busy window's minus the mean of the two alone windows'.

``extra_info``: ``shards``, ``masters``, ``commands_per_s`` (``{cmd: calls/s}``, every master),
``commands_per_shard_s``, ``by_activity_per_s`` (``{activity: commands/s}``, from MONITOR),
``redis_cpu_us_per_s`` and ``redis_cpu_us_per_shard_s`` (every master together),
``client_cpu_pct`` (this process, % of one core) and ``client_cpu_us_per_shard_s``.

With ``--benchmark-disable`` (``make test``): windows of 0.25 s, 1 and 6 shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

import lbs
from lbs.embedded import RedisClusterServers

from .cost import Cost, Window, combined
from .data import cleanup_node, service_name

if TYPE_CHECKING:
    from .conftest import Bench

SHARDS = (1, 6, 24)
WINDOW = float(os.environ.get("LBS_IDLE_SECONDS", "20"))
WARMUP = 3.0
#: A command's first key's ending -> the activity that sends it (MONITOR shows keys, not callers).
_BY_KEY = (
    (":paused", "controls"),
    (":orders:", "controls"),
    (":due", "delays"),
    (":waiting", "delays"),
    (":reaped", "recovery: deadline poller"),
    (":lease:", "heartbeat"),
)
_BY_COMMAND = {
    "XREADGROUP": "reader",
    "XINFO": "observer",
    "XLEN": "observer",
    "XPENDING": "recovery: scan",
    "EXISTS": "recovery: scan",
    "ZADD": "heartbeat",
    "MULTI": "heartbeat",
    "EXEC": "heartbeat",
    "PING": "keyspace listener",
    "EVALSHA": "scripts",
}


def activity(args: list[str]) -> str | None:
    """Which activity sends a command (its name and arguments, as MONITOR shows them): by its key,
    else by its name; ``ZRANGE`` of the deadline index is the deadline poller's; ``TIME`` is
    None (the caller gives it to the next command of the same connection, its pipeline's)."""
    cmd = args[0].upper()
    if cmd == "TIME":
        return None
    key = args[1] if len(args) > 1 else ""
    if cmd == "ZRANGE" and key.endswith(":deadlines"):
        return "recovery: deadline poller"
    for ending, what in _BY_KEY:
        if ending in key:
            return what
    return _BY_COMMAND.get(cmd, f"other: {cmd}")


async def _monitor(r: aioredis.Redis, seconds: float, out: Counter[str]) -> None:
    """Count, for ``seconds``, the commands of every other connection of ``r``'s server by activity."""
    last: dict[str, list[int]] = {}  # a connection's TIMEs not yet given to a command

    async def listen(m: Any) -> None:
        async for cmd in m.listen():
            who = f"{cmd.get('client_address')}:{cmd.get('client_port')}"
            args = str(cmd.get("command", "")).split()
            if not args:
                continue
            what = activity(args)
            if what is None:
                last.setdefault(who, []).append(1)
                continue
            out[what] += 1 + len(last.pop(who, []))

    async with r.monitor() as m:
        # A master no shard lives on hears nothing: redis-py's read times out there.
        with contextlib.suppress(asyncio.TimeoutError, RedisTimeoutError):
            await asyncio.wait_for(listen(m), seconds)
    for times in last.values():
        out["other: TIME"] += len(times)


async def _windows(rs: list[aioredis.Redis], seconds: float) -> Cost:
    windows = [await Window.open(r) for r in rs]
    await asyncio.sleep(seconds)
    return combined([await w.close() for w in windows])


async def measure(
    url: str, masters: list[aioredis.Redis], shards: int, seconds: float
) -> dict[str, Any]:
    """One row's figures (see the module)."""
    service = service_name("idle-shards")
    alone = await _windows(masters, seconds)
    c = lbs.ShardedClient(url, service, "idle", lbs.Config(), shards=shards)
    try:
        await c.start()
        await asyncio.sleep(min(WARMUP, seconds * 12))
        client0 = time.process_time()
        busy = await _windows(masters, seconds)
        client_cpu = time.process_time() - client0
        seen: Counter[str] = Counter()
        await asyncio.gather(*(_monitor(r, seconds, seen) for r in masters))
    finally:
        await c.close()
    after = await _windows(masters, seconds)
    for r in masters:
        await cleanup_node(r, service)
    alone_per_s = (alone.cpu / alone.seconds + after.cpu / after.seconds) / 2
    redis_per_s = max(0.0, busy.cpu / busy.seconds - alone_per_s)
    per_s = {cmd: round(calls / busy.seconds, 2) for cmd, (calls, _) in busy.commands.items()}
    per_s.pop("info", None)
    per_s = dict(sorted(per_s.items(), key=lambda kv: -kv[1]))
    return {
        "shards": shards,
        "masters": len(masters),
        "commands_per_s": per_s,
        "commands_total_per_s": round(sum(per_s.values()), 1),
        "commands_per_shard_s": round(sum(per_s.values()) / shards, 2),
        "by_activity_per_s": {k: round(v / seconds, 2) for k, v in seen.most_common()},
        "redis_cpu_us_per_s": round(redis_per_s * 1e6, 1),
        "redis_cpu_us_per_shard_s": round(redis_per_s * 1e6 / shards, 1),
        "redis_alone_cpu_us_per_s": round(alone_per_s * 1e6, 1),
        "client_cpu_pct": round(client_cpu / busy.seconds * 100, 2),
        "client_cpu_us_per_shard_s": round(client_cpu / busy.seconds * 1e6 / shards, 1),
        "window_s": round(busy.seconds, 2),
    }


@pytest.mark.parametrize("where", ["redis", "cluster"])
@pytest.mark.parametrize("shards", SHARDS)
def bench_idle_shards(
    bench: Bench, request: pytest.FixtureRequest, where: str, shards: int
) -> None:
    disabled = bench.benchmark.disabled
    if disabled and shards > 6:
        pytest.skip("the smoke run (make test) keeps to 1 and 6 shards")
    bench.benchmark.group = f"idle ShardedClient on {where}, Redis commands and CPU per shard"
    seconds = 0.25 if disabled else WINDOW
    if where == "cluster":
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        url = f"redis+cluster://{cluster.nodes[0].host}:{cluster.nodes[0].port}"
        masters = [aioredis.Redis(host=n.host, port=n.port) for n in cluster.masters]
        for r in masters:
            bench.defer(r.aclose)
    else:
        url = bench.url
        masters = [bench.redis()]
    rows: list[dict[str, Any]] = []

    async def measured() -> None:
        rows.append(await measure(url, masters, shards, seconds))

    bench(measured, rounds=1)
    bench.extra_info.update(rows[0])
    bench.extra_info["fixed_duration"] = True
