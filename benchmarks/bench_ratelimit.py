"""The fleet's rate limit (``Config.rate_limit``) beside the plain redis-py ways of doing the same.

One consumer drains 8,000 registrations under a limit of 2,000 a second (four windows' worth of
the 1 s windows' burst, so the limit shows in the time) and finishes each (XACK + XDEL, or lbs's done); Redis CPU and INFO
commandstats per assignment go to ``extra_info``:

* lbs ``run()`` with ``rate_limit`` (windows of 1 s, and of 0.1 s), and without a limit (what the
  rest of the cycle costs);
* redis-py, a fixed window per job as BullMQ's limiter and celery-style counters do: ``INCR`` +
  ``PEXPIRE`` of the window's key per job, then ``XREADGROUP COUNT 1`` if it fit (the group's
  baseline);
* redis-py, the classic token bucket in Lua, one ``EVALSHA`` per job before its ``XREADGROUP COUNT 1``.

With ``--benchmark-disable`` (``make test``): 300 registrations, once each.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
import redis.asyncio as aioredis

from lbs._bench import cycle_lbs_defaults, plain_group, plain_read, register

if TYPE_CHECKING:
    from .conftest import Bench

RATE = 2_000.0
N = 8_000
SMOKE_N = 300
WINDOW_MS = 1_000

#: The classic token bucket (tokens refill at ARGV[1] a second up to ARGV[2]): 1 when one is taken.
BUCKET = """
local rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]) or cap, tonumber(b[2]) or now
tokens = math.min(cap, tokens + (now - ts) * rate / 1000)
local ok = 0
if tokens >= 1 then tokens = tokens - 1; ok = 1 end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return ok
"""


async def _finish(r: aioredis.Redis, stream: str, group: str, entry_id: bytes) -> None:
    pipe = r.pipeline(transaction=False)
    pipe.xack(stream, group, entry_id)
    pipe.xdel(stream, entry_id)
    await pipe.execute()


async def cycle_lbs_limited(r: aioredis.Redis, service: str, n: int) -> int:
    return await cycle_lbs_defaults(r, service, n, rate_limit=RATE)


async def cycle_lbs_limited_fine(r: aioredis.Redis, service: str, n: int) -> int:
    return await cycle_lbs_defaults(r, service, n, rate_limit=RATE, rate_limit_window=0.1)


async def cycle_lbs_unlimited(r: aioredis.Redis, service: str, n: int) -> int:
    return await cycle_lbs_defaults(r, service, n)


async def cycle_redis_py_incr(r: aioredis.Redis, service: str, n: int) -> int:
    """A fixed window per job: INCR + PEXPIRE of the window's key, then read one if it fit."""
    stream, group = await plain_group(r, service)
    allow = int(RATE * WINDOW_MS / 1000)
    done = 0
    while done < n:
        now = time.time() * 1000
        key = f"{{{service}-input}}:plainrate:{int(now // WINDOW_MS)}"
        pipe = r.pipeline(transaction=False)
        pipe.incr(key)
        pipe.pexpire(key, 2 * WINDOW_MS)
        count, _ = await pipe.execute()
        if count > allow:
            await asyncio.sleep((WINDOW_MS - now % WINDOW_MS) / 1000)
            continue
        for entry_id, _ in await plain_read(r, group, stream, 1):
            await _finish(r, stream, group, entry_id)
            done += 1
    return done


async def cycle_redis_py_bucket(r: aioredis.Redis, service: str, n: int) -> int:
    """The classic token bucket in Lua: one EVALSHA per job, then read one if a token was taken."""
    stream, group = await plain_group(r, service)
    bucket = r.register_script(BUCKET)
    key = f"{{{service}-input}}:bucket"
    done = 0
    while done < n:
        if not await bucket(keys=[key], args=[RATE, RATE * WINDOW_MS / 1000]):
            await asyncio.sleep(1 / RATE)
            continue
        for entry_id, _ in await plain_read(r, group, stream, 1):
            await _finish(r, stream, group, entry_id)
            done += 1
    return done


CYCLES = {
    "lbs run() rate_limit (1 s windows)": cycle_lbs_limited,
    "lbs run() rate_limit (0.1 s windows)": cycle_lbs_limited_fine,
    "lbs run() no limit": cycle_lbs_unlimited,
    "redis-py INCR+PEXPIRE per job": cycle_redis_py_incr,
    "redis-py token bucket Lua per job": cycle_redis_py_bucket,
}
BASELINE = "redis-py INCR+PEXPIRE per job"


@pytest.mark.benchmark(group=f"rate limit {RATE:.0f}/s, {N} streams")
@pytest.mark.parametrize("impl", list(CYCLES))
def bench_rate_limited_drain(bench: Bench, impl: str) -> None:
    n = bench.size(N, SMOKE_N)

    async def registered() -> str:
        service = bench.service("rate")
        await register(bench.url, service, n)
        return service

    bench.drain(CYCLES[impl], n, registered, "assignment", baseline=impl == BASELINE)
