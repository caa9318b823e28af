"""Keyed, ordered processing beside a plain redis-py loop, in one run.

* Throughput: 10,000 keys x 10 messages (published interleaved, set-up
  outside the timing), drained by one consumer process: lbs ``run_keyed()``
  with a no-op handler, ``Config()`` defaults, ``concurrency=1024`` (as the
  assignment cycle's ``run()`` rows) and lbs-prometheus loaded
  (ordered per key, exclusive, fenced, each key let go when drained),
  against redis-py reading the same 100,000 messages from one stream with
  XREADGROUP COUNT 256 and acking each batch with one XACK (no order, no
  exclusivity). The **baseline** (``extra_info["baseline"]``; the ratio
  the docs print is lbs / it) is the best plain unordered loop: it keeps
  the next read in flight while it acks (on a second connection), as lbs
  keeps two round trips in flight. The serial plain loop (each read
  awaited before the ack) stays, labelled, to show what the read in flight
  is worth. The "one effect per message" group does the same with a
  handler that emits one entry per message (lbs: ``KeyedBatch.emit``,
  written by the fenced commit) against the one-read-in-flight loop that
  XADDs it in the pipeline of its XACK (its baseline). Client and Redis
  CPU and INFO commandstats per message go to ``extra_info``. One more lbs
  row adds lbs-otel on the SDK (every span dropped by its exporter), each
  message carrying a ``traceparent``: what tracing each batch costs.
* Latency: a publisher at 2,000 messages/s over 200 keys for 3 s and one
  consumer in the same process; p50 and p99 publish-to-handler latency in
  ``extra_info``, beside the plain loop (XADD to one stream, XREADGROUP
  BLOCK 50 ms) under the same publisher.

With ``--benchmark-disable`` (``make test``), once each: 2,000 keys x 10
messages, half a second of the publisher, a tenth of the memory rows' keys.
"""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

import lbs
from lbs._bench import plain_group as _plain_group
from lbs._bench import plain_read as _plain_read
from lbs_prometheus import PrometheusPlugin

from .bench_client import TRACEPARENT, otel_sdk_plugin

if TYPE_CHECKING:
    from .conftest import Bench

KEYS, PER_KEY = 10_000, 10
#: Keys held at once, as the assignment cycle's "defaults" rows run ``run(handler, concurrency=1024)``.
CONCURRENCY = 1024
CHUNK = 2_000


#: Keys with ``--benchmark-disable`` (``make test``): more than ``CONCURRENCY``, so keys still wait for
#: a slot, each with its ``PER_KEY`` messages.
SMOKE_KEYS = 2_000


def _messages(keys: int, **extra: str) -> list[tuple[str, dict[str, str | int]]]:
    """Message i of every key, then message i + 1 of every key: keys interleaved, as live traffic is."""
    return [
        (f"key-{k}", {"n": i, "body": "x" * 32, **extra})
        for i in range(PER_KEY)
        for k in range(keys)
    ]


async def _published(bench: Bench, keys: int, **extra: str) -> str:
    service = bench.service("keyed")
    msgs = _messages(keys, **extra)
    async with lbs.Publisher(bench.url, service) as pub:
        for at in range(0, len(msgs), CHUNK):
            await pub.publish_many(msgs[at : at + CHUNK])
    return service


async def _plain_stream(bench: Bench, keys: int) -> str:
    """The same messages in one stream, as a plain loop would read them."""
    service = bench.service("keyed-plain")
    r = bench.redis()
    stream = lbs.input_stream(service)
    msgs = _messages(keys)
    for at in range(0, len(msgs), CHUNK):
        pipe = r.pipeline(transaction=False)
        for key, fields in msgs[at : at + CHUNK]:
            pipe.xadd(stream, {"key": key, **fields})
        await pipe.execute()
    return service


async def _noop(batch: lbs.KeyedBatch) -> None:
    return None


async def _emit(batch: lbs.KeyedBatch) -> None:
    out = batch.data_stream.partition("}:")[0] + "}:out"
    for m in batch.messages:
        batch.emit(out, {"n": m.fields["n"]}, m)


async def keyed_lbs(
    r: aioredis.Redis,
    service: str,
    n: int,
    handler: lbs.KeyedHandler = _noop,
    more: tuple[object, ...] = (),
    **options: Any,
) -> int:
    """run_keyed() as an application gets it: Config() defaults, concurrency=1024, lbs-prometheus
    loaded (and the plugins in ``more``); ``n`` messages, ``PER_KEY`` a key."""
    c = lbs.Client(
        r,
        service,
        "bench",
        lbs.Config(),
        plugins=[PrometheusPlugin(registry=CollectorRegistry()), *more],
        load_entrypoint_plugins=False,
    )
    runner = asyncio.create_task(c.run_keyed(handler, CONCURRENCY, **options))
    try:
        # Every message handled; the drained keys that linger are let go by close(), timed too.
        while c.stats.keyed_messages < n:
            await asyncio.sleep(0.005)
    finally:
        await c.close()
        await runner
    assert c.stats.done == n // PER_KEY, c.stats.done  # every key let go, drained
    return c.stats.keyed_messages


async def keyed_plain(r: aioredis.Redis, service: str, n: int) -> int:
    """XREADGROUP COUNT 256 on one stream, one XACK per batch, each read awaited before the ack:
    no order, no exclusivity. Not the baseline (``keyed_plain_ahead`` is)."""
    stream, group = await _plain_group(r, service)
    done = 0
    while done < n:
        entries = await _plain_read(r, group, stream, 256)
        if entries:
            await r.xack(stream, group, *(entry_id for entry_id, _ in entries))
            done += len(entries)
    return done


async def keyed_lbs_effects(r: aioredis.Redis, service: str, n: int) -> int:
    """keyed_lbs with a handler that emits one entry per message."""
    return await keyed_lbs(r, service, n, _emit)


async def keyed_lbs_otel(r: aioredis.Redis, service: str, n: int) -> int:
    """keyed_lbs with lbs-otel on the SDK (spans dropped), every message carrying a traceparent:
    what the lbs.handle_batch span costs per message."""
    return await keyed_lbs(r, service, n, more=(otel_sdk_plugin(),))


async def _published_traced(bench: Bench, keys: int) -> str:
    """As :func:`_published`, every message with a ``traceparent`` (as lbs-otel's publisher adds)."""
    return await _published(bench, keys, traceparent=TRACEPARENT)


async def keyed_plain_ahead(r: aioredis.Redis, service: str, n: int, effects: bool = False) -> int:
    """The baseline: keyed_plain keeping one read in flight: the next XREADGROUP goes out (on a second
    connection of the pool) before this batch's XACK (and, with ``effects``, its XADDs in the same
    pipeline)."""
    stream, group = await _plain_group(r, service)
    out = stream + ":out"
    done = 0
    ahead = asyncio.ensure_future(_plain_read(r, group, stream, 256))
    try:
        while done < n:
            entries = await ahead
            if done + len(entries) < n:
                ahead = asyncio.ensure_future(_plain_read(r, group, stream, 256))
            if entries:
                pipe = r.pipeline(transaction=False)
                if effects:
                    for _, fields in entries:
                        pipe.xadd(out, {"n": fields[b"n"]})
                pipe.xack(stream, group, *(entry_id for entry_id, _ in entries))
                await pipe.execute()
                done += len(entries)
    finally:
        if not ahead.done():
            ahead.cancel()
    return done


async def keyed_lbs_no_linger(r: aioredis.Redis, service: str, n: int) -> int:
    return await keyed_lbs(r, service, n, linger=0)


async def keyed_plain_ahead_effects(r: aioredis.Redis, service: str, n: int) -> int:
    return await keyed_plain_ahead(r, service, n, effects=True)


THROUGHPUT = f"keyed throughput, {KEYS} keys x {PER_KEY} messages"
EFFECTS = f"keyed throughput, one effect per message, {KEYS} keys x {PER_KEY} messages"
#: impl: (cycle, set-up, group, is the group's baseline)
SIDES = {
    "lbs run_keyed() defaults+prometheus": (keyed_lbs, _published, THROUGHPUT, False),
    "lbs run_keyed(linger=0) defaults+prometheus": (
        keyed_lbs_no_linger,
        _published,
        THROUGHPUT,
        False,
    ),
    "lbs run_keyed() defaults+prometheus+otel (SDK, spans dropped)": (
        keyed_lbs_otel,
        _published_traced,
        THROUGHPUT,
        False,
    ),
    "redis-py XREADGROUP + XACK, one read in flight, unordered": (
        keyed_plain_ahead,
        _plain_stream,
        THROUGHPUT,
        True,
    ),
    "redis-py XREADGROUP + XACK, serial (no read in flight), unordered": (
        keyed_plain,
        _plain_stream,
        THROUGHPUT,
        False,
    ),
    "lbs run_keyed() defaults+prometheus, one effect per message": (
        keyed_lbs_effects,
        _published,
        EFFECTS,
        False,
    ),
    "redis-py one read in flight, XADD effect + XACK, unordered": (
        keyed_plain_ahead_effects,
        _plain_stream,
        EFFECTS,
        True,
    ),
}


@pytest.mark.parametrize("impl", list(SIDES))
def bench_keyed_throughput(bench: Bench, impl: str) -> None:
    fn, setup, group, baseline = SIDES[impl]
    bench.benchmark.group = group
    keys = bench.size(KEYS, SMOKE_KEYS)
    bench.drain(fn, keys * PER_KEY, lambda: setup(bench, keys), "message", baseline=baseline)


# ---------------------------------------------------------------- latency ---
#
# A steady publisher (2,000 messages/s over 200 keys, for 3 s) and one consumer
# in the same process: each message carries its publish time, each handler
# records how long ago that was. The timing of the round is the run itself;
# the figures are the latency percentiles in extra_info.

RATE, SECONDS, LATENCY_KEYS = 2_000, 3.0, 200


async def _steady(
    publish: Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[Any]], seconds: float
) -> int:
    """Publish RATE messages a second for ``seconds``, in ticks of 10 ms; how many."""
    loop = asyncio.get_running_loop()
    start, sent, tick = loop.time(), 0, 0.01
    total = int(RATE * seconds)
    while sent < total:
        due = min(total, int((loop.time() - start) * RATE) + 1)
        if due > sent:
            now = time.perf_counter()
            await publish([(f"key-{i % LATENCY_KEYS}", {"t": repr(now)}) for i in range(sent, due)])
            sent = due
        await asyncio.sleep(tick)
    return sent


async def latency_lbs(bench: Bench, service: str, seconds: float) -> list[float]:
    seen: list[float] = []

    async def handle(batch: lbs.KeyedBatch) -> None:
        now = time.perf_counter()
        seen.extend(now - float(m.fields["t"]) for m in batch.messages)

    c = lbs.Client(bench.url, service, "bench", lbs.Config(), load_entrypoint_plugins=False)
    runner = asyncio.create_task(c.run_keyed(handle))
    async with lbs.Publisher(bench.url, service) as pub:
        total = await _steady(pub.publish_many, seconds)
    while len(seen) < total:
        await asyncio.sleep(0.01)
    await c.close()
    await runner
    return seen


async def latency_plain(bench: Bench, service: str, seconds: float) -> list[float]:
    r = bench.redis()
    stream, group = await _plain_group(r, service)
    seen: list[float] = []
    stop = asyncio.Event()

    async def consume() -> None:
        while not stop.is_set():
            entries = await _plain_read(r, group, stream, 256)
            now = time.perf_counter()
            if entries:
                seen.extend(now - float(fields[b"t"]) for _, fields in entries)
                await r.xack(stream, group, *(entry_id for entry_id, _ in entries))

    async def publish(batch: list[tuple[str, dict[str, Any]]]) -> None:
        pipe = r.pipeline(transaction=False)
        for key, fields in batch:
            pipe.xadd(stream, {"key": key, **fields})
        await pipe.execute()

    consumer = asyncio.create_task(consume())
    total = await _steady(publish, seconds)
    while len(seen) < total:
        await asyncio.sleep(0.01)
    stop.set()
    await consumer
    return seen


LATENCY = {
    "lbs run_keyed() defaults": latency_lbs,
    "redis-py XREADGROUP + XACK, unordered": latency_plain,
}


@pytest.mark.benchmark(group=f"keyed latency, {RATE} messages/s over {LATENCY_KEYS} keys")
@pytest.mark.parametrize("impl", list(LATENCY))
def bench_keyed_latency(bench: Bench, impl: str) -> None:
    seen: list[float] = []
    seconds = bench.size(SECONDS, 0.5)  # --benchmark-disable: half a second of the publisher

    async def measured(service: str) -> None:
        seen.extend(await LATENCY[impl](bench, service, seconds))

    bench(measured, setup=lambda: bench.service("latency"), rounds=1)
    ms = sorted(x * 1000 for x in seen)
    bench.extra_info["baseline"] = impl.startswith("redis-py")
    bench.extra_info["fixed_duration"] = True
    bench.extra_info["messages"] = len(ms)
    bench.extra_info["p50_ms"] = round(ms[len(ms) // 2], 2)
    bench.extra_info["p99_ms"] = round(ms[int(len(ms) * 0.99)], 2)


# ----------------------------------------------------------------- memory ---
#
# What the consumer process keeps per key, counted by tracemalloc in one
# run_keyed() client (defaults, concurrency=1024):
# * per held key: 1,000 keys taken and in their handler (blocked on an event),
#   one 40-byte message each: the hold, its batch, the message, the handler's
#   task;
# * per idle registered key: after 10,000 keys were processed and let go
#   (drained: a key registers again with its next message), what the client
#   still keeps for them (nothing is expected: no per-key state outlives a
#   hold). The timing is of the whole measurement (tracemalloc slows it).

MEMORY_HELD, MEMORY_IDLE = 1_000, 10_000


async def _traced(fn: Callable[[], Awaitable[Any]]) -> int:
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    await fn()
    gc.collect()
    return tracemalloc.get_traced_memory()[0] - before


async def keyed_memory(bench: Bench, held_keys: int, idle_keys: int) -> dict[str, float]:
    service = bench.service("keyed-memory")
    async with lbs.Publisher(bench.url, service) as pub:
        await pub.publish_many([(f"idle-{k}", {"body": "x" * 32}) for k in range(idle_keys)])
    gate, held = asyncio.Event(), 0

    async def handle(batch: lbs.KeyedBatch) -> None:
        nonlocal held
        if batch.key.startswith("held-"):
            held += 1
            await gate.wait()

    c = lbs.Client(bench.url, service, "bench", lbs.Config(), load_entrypoint_plugins=False)
    tracemalloc.start()
    try:
        runner = asyncio.create_task(c.run_keyed(handle, CONCURRENCY))
        while c.stats.done < 100:  # warmed up: connections, scripts, first batches
            await asyncio.sleep(0.01)

        async def idle() -> None:
            while c.stats.done < idle_keys:
                await asyncio.sleep(0.01)

        async def hold() -> None:
            async with lbs.Publisher(bench.url, service) as pub:
                await pub.publish_many(
                    [(f"held-{k}", {"body": "x" * 32}) for k in range(held_keys)]
                )
            while held < held_keys:
                await asyncio.sleep(0.01)

        # Idle keys are measured from after the warm-up: all but its 100 went by.
        idle_bytes = await _traced(idle)
        held_bytes = await _traced(hold)
        gate.set()
        await c.close()
        await runner
    finally:
        tracemalloc.stop()
    return {
        "bytes_per_idle_key": idle_bytes / (idle_keys - 100),
        "bytes_per_held_key": held_bytes / held_keys,
    }


@pytest.mark.benchmark(group="keyed memory")
def bench_keyed_memory(bench: Bench) -> None:
    figures: dict[str, float] = {}

    async def measured() -> None:
        # --benchmark-disable: a tenth of the keys (still past the 100 of the warm-up).
        held, idle = (
            bench.size(MEMORY_HELD, MEMORY_HELD // 10),
            bench.size(MEMORY_IDLE, MEMORY_IDLE // 10),
        )
        figures.update(await keyed_memory(bench, held, idle))

    bench(measured, rounds=1)
    for name, value in figures.items():
        bench.extra_info[name] = round(value)
