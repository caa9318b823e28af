"""The assignment cycle, measured: shared by ``benchmarks/bench_client.py`` and ``lbs bench``.

One cycle consumes ``n`` registered data streams (read and take, a no-op
handler, done); registering them (:func:`register`, one pipelined producer,
the same for every side) is set-up, outside the timing. :func:`measure` runs
one cycle and takes the client's CPU time (this process) and Redis's (its
``INFO cpu``, so every client of that server counts) around it.

* :func:`cycle_lbs_run`: lbs's public ``run()`` with a no-op handler, tuned
  (``max_streams`` 1,000, short blocking reads, no keyspace events).
* :func:`cycle_lbs_defaults`: what an application gets: the default
  ``lbs.Config()``, ``run(handler, concurrency=1024)``, and whatever plugins
  are passed (``make bench`` passes lbs-prometheus too).
* :func:`cycle_redis_py_batched_lua`: the best plain redis-py design
  (XREADGROUP COUNT 256, the batch's SET NX in one pipeline, the batch's
  completion in one Lua call), the baseline lbs is compared with.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.asyncio as aioredis

from _lbscore import decode_input

from . import _keys
from ._redis.connection import ensure_group, open_plain
from .client import Client
from .config import Config
from .notifications import Notification

__all__ = [
    "CHUNK",
    "CYCLE_N",
    "Cycle",
    "config",
    "cycle_lbs_defaults",
    "cycle_lbs_run",
    "cycle_redis_py_batched_lua",
    "measure",
    "plain_group",
    "plain_read",
    "register",
    "server_cpu",
]

#: Data streams per cycle in ``make bench``.
CYCLE_N = 20_000
#: Streams per registration batch; lbs's ``max_streams`` in the cycle (``read_count`` half of it).
CHUNK = 1_000

#: A cycle: ``await cycle(r, service, n)`` consumes the service's ``n`` streams and returns how many it finished.
Cycle = Callable[[aioredis.Redis, str, int], Awaitable[int]]


def config(**kw: Any) -> Config:
    """The benchmarks' Config: short blocking reads, no keyspace events, a lease TTL that outlives any round."""
    base: dict[str, Any] = dict(read_block=0.05, configure_keyspace_events=False, lock_ttl=60.0)
    base.update(kw)
    return Config(**base)


async def register(redis: aioredis.Redis | str, service: str, n: int) -> None:
    """Register data streams ``s0`` ... ``s<n-1>`` in ``service``'s LBS, ``CHUNK`` per round trip.

    Written as a plain Python producer would (redis-py, ``json.dumps`` with its
    default separators), not by ``lbs.Producer``: every side reads what
    applications most often write.
    """
    r = open_plain(redis) if isinstance(redis, str) else redis
    stream = _keys.input_stream(service)
    try:
        for i in range(0, n, CHUNK):
            pipe = r.pipeline(transaction=False)
            for j in range(i, min(n, i + CHUNK)):
                pipe.xadd(
                    stream, {_keys.INPUT_FIELD: json.dumps({"DataStreamName": f"s{j}", "Info": {}})}
                )
            await pipe.execute()
    finally:
        if r is not redis:
            await r.aclose()


async def _noop(note: Notification) -> None:
    return None


async def _run(c: Client, n: int, concurrency: int | None = None) -> int:
    """``c.run()`` with a no-op handler until ``n`` streams finished; completions are
    counted by the client itself, so the handler stays a pure no-op."""
    runner = asyncio.create_task(c.run(_noop, concurrency))
    try:
        await c.wait_finished(n)
    finally:
        await c.close()
        await runner
    return c.stats.finished


async def cycle_lbs_run(r: aioredis.Redis, service: str, n: int) -> int:
    """The public run() API, tuned: ``max_streams`` 1,000, reads of 500."""
    return await _run(
        Client(
            r,
            service,
            "bench",
            config(max_streams=CHUNK, read_count=CHUNK // 2),
            load_entrypoint_plugins=False,
        ),
        n,
    )


async def cycle_lbs_defaults(
    r: aioredis.Redis,
    service: str,
    n: int,
    plugins: Sequence[object] = (),
    *,
    installed: bool = False,
    **config: Any,
) -> int:
    """run() as an application gets it: ``lbs.Config(**config)`` (none: the defaults), ``concurrency=1024``,
    the given plugins, and with ``installed`` the installed ones too (their entry points)."""
    return await _run(
        Client(
            r,
            service,
            "bench",
            Config(**config),
            plugins=plugins,
            load_entrypoint_plugins=installed,
        ),
        n,
        concurrency=1024,
    )


async def plain_read(r: aioredis.Redis, group: str, stream: str, count: int) -> list[Any]:
    """One XREADGROUP's ``(id, fields)`` entries, in either RESP shape."""
    reply = await r.xreadgroup(group, "bench", {stream: ">"}, count=count, block=50)
    return [
        e
        for _, es in (reply.items() if isinstance(reply, dict) else reply)
        for e in (es[0] if isinstance(reply, dict) else es)
    ]


async def plain_group(r: aioredis.Redis, service: str) -> tuple[str, str]:
    """The service's LBS and group, the group created (at id 0) if needed."""
    stream, group = _keys.input_stream(service), _keys.group_name(service)
    await ensure_group(r, stream, group)
    return stream, group


# The completion of a batch in one Lua call: release, ack, delete.
_FINISH_LUA = """
for i = 2, #KEYS do
  redis.call('DEL', KEYS[i])
end
redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return #ARGV - 1
"""


async def cycle_redis_py_batched_lua(r: aioredis.Redis, service: str, n: int) -> int:
    """The best plain redis-py design: XREADGROUP COUNT 256, the batch's SET NX
    in one pipeline, the batch's completion in one Lua call."""
    stream, group = await plain_group(r, service)
    finish = r.register_script(_FINISH_LUA)
    done = 0
    while done < n:
        entries = await plain_read(r, group, stream, 256)
        if not entries:
            continue
        ids = [entry_id.decode() for entry_id, _ in entries]
        locks = [_keys.lock_key(service, i) for i in ids]
        pipe = r.pipeline(transaction=False)
        for (_, fields), lock in zip(entries, locks):
            decode_input(fields[b"lbs-input"])
            pipe.set(lock, "bench", nx=True, px=60_000)
        await pipe.execute()
        done += await finish(keys=[stream, *locks], args=[group, *ids])
    return done


async def server_cpu(r: aioredis.Redis) -> float:
    """Redis's CPU time so far (system + user seconds), from ``INFO cpu``."""
    info = await r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def measure(
    cycle: Cycle, r: aioredis.Redis, service: str, n: int
) -> tuple[int, float, float]:
    """Run one cycle; ``(finished, client CPU seconds, Redis CPU seconds)``."""
    server0, client0 = await server_cpu(r), time.process_time()
    done = await cycle(r, service, n)
    return done, time.process_time() - client0, await server_cpu(r) - server0
