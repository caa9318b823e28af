"""What a scheduled registration costs Redis: lbs beside the plain redis-py way, same server, one run.

* **lbs**: ``Producer.add_stream(name, info, delay=...)``, one call per registration (parked in
  ``{<service>-input}:delayed`` and scored in ``{..}:due``: ``WATCH``, ``TIME``, ``XINFO STREAM``,
  then ``MULTI``, ``XADD``, ``ZADD``, ``EXEC``); then its promotion as a consumer's promotion task
  does it when each is due on its own: the Lua-free look (``TIME``, two ``ZRANGE``) and one
  ``promote-4.lua`` call that moves it into the LBS.
* **plain** (the baseline): ``ZADD`` of the registration's JSON into a sorted set scored by its due
  time; a poller's ``ZRANGEBYSCORE -inf <now> LIMIT 0 1``, ``ZREM`` and ``XADD`` into the stream per
  registration (not atomic: a poller that dies between ZREM and XADD loses it).

Each side registers N streams (all due at once, so the timing is Redis's alone) in a window
(:class:`benchmarks.cost.Window`), then promotes them one call each in a second window.
``extra_info``: ``produce_per_registration`` and ``promote_per_registration``
(``{cmd: [calls, usec]}``), ``redis_cpu_us_per_registration`` (both windows' Redis CPU).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

import lbs
from lbs import _keys
from lbs._redis.scripts import source

from .cost import Window
from .data import stream_specs

if TYPE_CHECKING:
    from .conftest import Bench

N = 500
SIDES = ["lbs Producer delay= + promote-4", "redis-py ZADD + ZRANGEBYSCORE/ZREM/XADD poller"]


@pytest.mark.benchmark(group=f"schedule and promote {N} registrations")
@pytest.mark.parametrize("impl", SIDES)
def bench_scheduled(bench: Bench, impl: str) -> None:
    r = bench.redis()
    n = bench.size(N, 20)
    specs = stream_specs(n)
    out: dict[str, Any] = {}

    async def measured(service: str) -> None:
        stream = lbs.input_stream(service)
        window = await Window.open(r)
        if impl == SIDES[0]:
            async with lbs.Producer(r, service, load_entrypoint_plugins=False) as p:
                for name, info in specs:
                    await p.add_stream(name, info, delay=0.001)
        else:
            sec, usec = await r.time()
            due = sec * 1000 + usec // 1000
            for name, info in specs:
                await r.zadd(f"{service}-scheduled", {lbs.encode_input(name, info): due})
        produced = await window.close()
        time.sleep(0.01)  # every one due
        sha = await r.script_load(source("promote-4"))
        window = await Window.open(r)
        if impl == SIDES[0]:
            keys = [_keys.due_key(service), _keys.delayed_stream(service), stream]
            keys.append(_keys.waiting_key(service))
            args = [500, _keys.group_name(service), _keys.key_prefix(service)]
            for _ in specs:
                await r.time()
                await r.zrange(keys[0], 0, 0, withscores=True)
                await r.zrange(keys[3], 0, 0, withscores=True)
                await r.evalsha(sha, 4, *keys, *args)  # one moved per call
        else:
            for _ in specs:
                sec, usec = await r.time()
                now = sec * 1000 + usec // 1000
                (member,) = await r.zrangebyscore(f"{service}-scheduled", "-inf", now, 0, 1)
                if await r.zrem(f"{service}-scheduled", member):
                    await r.xadd(stream, {"lbs-input": member})
        promoted = await window.close()
        assert await r.xlen(stream) == n
        out.update(produced=produced, promoted=promoted)

    bench(measured, setup=lambda: bench.service("sched"), rounds=1)
    produced, promoted = out["produced"], out["promoted"]
    info = bench.extra_info
    info["baseline"] = impl == SIDES[1]
    info["registrations"] = n
    info["produce_per_registration"] = produced.per(n)
    info["promote_per_registration"] = promoted.per(n)
    info["redis_cpu_us_per_registration"] = round((produced.cpu + promoted.cpu) / n * 1e6, 1)
    info["produce_redis_cpu_us_per_registration"] = round(produced.cpu / n * 1e6, 1)
    info["promote_redis_cpu_us_per_registration"] = round(promoted.cpu / n * 1e6, 1)
    json.dumps(info)  # plain JSON for the report
