"""The client beside plain redis-py doing the same work, in one run.

* Assignment cycle (read, lock, no-op, done) for 20,000 streams registered
  by a plain Python producer (``json.dumps``, default separators; set-up,
  outside the timing), in one consumer process: lbs ``run()`` with a no-op
  handler (tuned; with the default ``Config()`` and ``concurrency=1024``; that
  with lbs-prometheus loaded; with lbs-otel on the OpenTelemetry API alone, and on
  the SDK with an exporter that drops every span, its registrations carrying a
  ``traceparent``; and that with the installed plugins loaded
  from their entry points, as an application gets them) and batched with
  ``done_streams``, against redis-py one command per round trip (what the Go
  client does), redis-py pipelines, and the best plain redis-py design, the
  group's baseline (XREADGROUP COUNT 256, SET NX for the batch in one
  pipeline, completion of the batch in one Lua call). Each row's client and
  Redis CPU and INFO commandstats per assignment go to ``extra_info``.
* Heartbeat tick with 10,000 and 100,000 held streams: lbs's tick (the
  consumer's lease extended, fenced by its nonce, and its deadline moved: one
  key whatever is held) against redis-py pipelining a bare PEXPIRE of a lock
  per held stream (the RFC's locks, set for those rows: a lower bound that
  checks no ownership) and, at 10,000, one PEXPIRE per round trip (the Go
  client's timer per stream).

With ``--benchmark-disable`` (``make test``): cycles of 2,000 streams and
heartbeats of a tenth of the held streams, once each.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest
import redis.asyncio as aioredis
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

import lbs
from lbs._bench import (
    CHUNK,
    CYCLE_N,
    cycle_lbs_defaults,
    cycle_lbs_run,
    cycle_redis_py_batched_lua,
    register,
)
from lbs._bench import config as _config
from lbs._bench import plain_group as _plain_group
from lbs._bench import plain_read as _plain_read
from lbs._bench import server_cpu as _server_cpu
from lbs._keys import lock_key
from lbs_otel import OtelPlugin
from lbs_prometheus import PrometheusPlugin

if TYPE_CHECKING:
    from .conftest import Bench


# ------------------------------------------------------- assignment cycle ---
#
# Every side consumes the same n registered data streams; registering them
# (one pipelined producer, the same for all) is set-up, outside the timing.
# Each round records client CPU and Redis CPU per assignment in extra_info.
# The lbs run() cycle, the redis-py batched + Lua baseline and what the
# cycles share live in lbs._bench, which `lbs bench` runs too.


async def _registered(bench: Bench, tag: str, n: int) -> str:
    service = bench.service(tag)
    await register(bench.url, service, n)
    return service


async def cycle_lbs_batched(r: aioredis.Redis, service: str, n: int) -> int:
    c = lbs.Client(
        r,
        service,
        "bench",
        _config(max_streams=CHUNK, read_count=CHUNK // 2),
        load_entrypoint_plugins=False,
    )
    await c.start()
    finished = 0
    while finished < n:
        first = await c.next_notification()
        assert first is not None
        batch = [first, *c.drain_notifications()]
        finished += len(await c.done_streams(batch))
    await c.close()
    return finished


async def cycle_redis_py_one_by_one(r: aioredis.Redis, service: str, n: int) -> int:
    """One command per round trip, as the Go client does it."""
    stream, group = await _plain_group(r, service)
    done = 0
    while done < n:
        reply = await r.xreadgroup(group, "bench", {stream: ">"}, count=1, block=50)
        for _, entries in reply.items() if isinstance(reply, dict) else reply:
            for entry_id, fields in entries[0] if isinstance(reply, dict) else entries:
                lbs.decode_input(fields[b"lbs-input"])
                lock = lock_key(service, entry_id.decode())
                await r.set(lock, "bench", nx=True, px=60_000)
                await r.delete(lock)
                await r.xack(stream, group, entry_id)
                await r.xdel(stream, entry_id)
                done += 1
    return done


async def cycle_redis_py_pipelines(r: aioredis.Redis, service: str, n: int) -> int:
    """The same steps, each batch of 1,000 pipelined."""
    stream, group = await _plain_group(r, service)
    done = 0
    while done < n:
        entries = await _plain_read(r, group, stream, CHUNK)
        pipe = r.pipeline(transaction=False)
        for entry_id, fields in entries:
            lbs.decode_input(fields[b"lbs-input"])
            pipe.set(lock_key(service, entry_id.decode()), "bench", nx=True, px=60_000)
        await pipe.execute()
        pipe = r.pipeline(transaction=False)
        for entry_id, _ in entries:
            pipe.delete(lock_key(service, entry_id.decode()))
            pipe.xack(stream, group, entry_id)
            pipe.xdel(stream, entry_id)
        await pipe.execute()
        done += len(entries)
    return done


async def cycle_lbs_run_defaults(r: aioredis.Redis, service: str, n: int) -> int:
    return await cycle_lbs_defaults(r, service, n)


async def cycle_lbs_run_defaults_prometheus(r: aioredis.Redis, service: str, n: int) -> int:
    """The same with lbs-prometheus loaded (its own registry, no HTTP server): what metrics cost."""
    return await cycle_lbs_defaults(r, service, n, [PrometheusPlugin(registry=CollectorRegistry())])


async def cycle_lbs_run_defaults_otel_api(r: aioredis.Redis, service: str, n: int) -> int:
    """The defaults with lbs-otel on the OpenTelemetry API alone (no SDK): what installing it costs
    an application that does not trace (the handler is not wrapped)."""
    return await cycle_lbs_defaults(
        r, service, n, [OtelPlugin(tracer_provider=NoOpTracerProvider())]
    )


class _Dropped(SpanExporter):
    """An exporter that drops every span: the SDK's cost without an exporter's."""

    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def otel_sdk_plugin() -> OtelPlugin:
    """lbs-otel on the SDK, a simple processor whose exporter drops every span."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_Dropped()))
    return OtelPlugin(tracer_provider=provider)


async def cycle_lbs_run_defaults_otel_sdk(r: aioredis.Redis, service: str, n: int) -> int:
    """The defaults with lbs-otel on the SDK (a simple processor, spans dropped), registrations
    carrying a traceparent: the spans' cost per assignment (lbs.wait, lbs.handle, lbs.done)."""
    return await cycle_lbs_defaults(r, service, n, [otel_sdk_plugin()])


#: What the traced rows' registrations carry beside lbs-input (a producer span's context).
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def _registered_traced(bench: Bench, tag: str, n: int) -> str:
    """As :func:`_registered`, each entry with a ``traceparent`` (as lbs-otel's producer writes)."""
    service = bench.service(tag)
    r = aioredis.Redis.from_url(bench.url)
    try:
        for i in range(0, n, CHUNK):
            pipe = r.pipeline(transaction=False)
            for j in range(i, min(n, i + CHUNK)):
                payload = f'{{"DataStreamName": "s{j}", "Info": {{}}}}'
                pipe.xadd(
                    lbs.input_stream(service), {"lbs-input": payload, "traceparent": TRACEPARENT}
                )
            await pipe.execute()
    finally:
        await r.aclose()
    return service


async def cycle_lbs_run_defaults_go_compatible(r: aioredis.Redis, service: str, n: int) -> int:
    """The defaults with ``go_compatible=True`` (Go-style locks beside lbs's, a 2-s heartbeat): the mode's cost."""
    return await cycle_lbs_defaults(r, service, n, go_compatible=True)


async def cycle_lbs_run_defaults_no_journal(r: aioredis.Redis, service: str, n: int) -> int:
    """The defaults with ``journal=False``: what the journal (on by default) costs the cycle."""
    return await cycle_lbs_defaults(r, service, n, journal=False)


async def cycle_lbs_run_installed(r: aioredis.Redis, service: str, n: int) -> int:
    """run() as an application gets it: ``Config()`` defaults, ``concurrency=1024``, the installed
    plugins loaded from their entry points (lbs-claim's reader, lbs-prometheus into its REGISTRY)."""
    return await cycle_lbs_defaults(r, service, n, installed=True)


#: The plain design lbs's cycle is compared with (``extra_info["baseline"]``).
BASELINE = "redis-py batched + Lua"
CYCLES = {
    "lbs run()": cycle_lbs_run,
    "lbs run() defaults": cycle_lbs_run_defaults,
    "lbs run() defaults+prometheus": cycle_lbs_run_defaults_prometheus,
    "lbs run() defaults+otel (API only)": cycle_lbs_run_defaults_otel_api,
    "lbs run() defaults+otel (SDK, spans dropped)": cycle_lbs_run_defaults_otel_sdk,
    "lbs run() defaults+installed plugins": cycle_lbs_run_installed,
    "lbs run() defaults go_compatible": cycle_lbs_run_defaults_go_compatible,
    "lbs run() defaults journal=False": cycle_lbs_run_defaults_no_journal,
    "lbs done_streams": cycle_lbs_batched,
    "redis-py batched + Lua": cycle_redis_py_batched_lua,
    "redis-py pipelines": cycle_redis_py_pipelines,
    "redis-py one per round trip": cycle_redis_py_one_by_one,
}


#: The rows whose registrations carry a trace context.
TRACED = {"lbs run() defaults+otel (SDK, spans dropped)"}


#: Streams per cycle with ``--benchmark-disable`` (``make test``): two registration batches, more
#: than lbs's ``max_streams`` at once, so every side still reads, waits for room and reads again.
SMOKE_N = 2 * CHUNK


@pytest.mark.benchmark(group=f"assignment cycle, {CYCLE_N} streams")
@pytest.mark.parametrize("impl", list(CYCLES))
def bench_assignment_cycle(bench: Bench, impl: str) -> None:
    n = bench.size(CYCLE_N, SMOKE_N)
    bench.drain(
        CYCLES[impl],
        n,
        lambda: (_registered_traced if impl in TRACED else _registered)(bench, "cycle", n),
        "assignment",
        baseline=impl == BASELINE,
    )


# -------------------------------------------------------------- heartbeat ---


async def _holding(bench: Bench, n: int) -> tuple[aioredis.Redis, lbs.Client]:
    service = bench.service(f"hb{n}")
    r = bench.redis()
    async with lbs.Producer(r, service) as p:
        for i in range(0, n, 10_000):
            await p.add_streams([f"s{j}" for j in range(i, min(n, i + 10_000))])
    c = lbs.Client(
        r,
        service,
        "bench",
        _config(
            max_streams=n,
            read_count=10_000,
            notification_buffer=n + 1,
            lock_ttl=600.0,
            heartbeat_interval=300.0,
        ),
        load_entrypoint_plugins=False,
    )
    await c.start()
    bench.defer(c.close)
    while c.held < n:
        await asyncio.sleep(0.05)
    return r, c


async def _locked(r: aioredis.Redis, locks: list[str], owner: str) -> None:
    """Set every lock of ``locks`` (value "1:<owner>", 600 s), 10,000 a pipeline."""
    for i in range(0, len(locks), 10_000):
        pipe = r.pipeline(transaction=False)
        for k in locks[i : i + 10_000]:
            pipe.set(k, f"1:{owner}", px=600_000)
        await pipe.execute()


HEARTBEAT_CASES = [
    (impl, held)
    for held in (10_000, 100_000)
    for impl in ("lbs heartbeat", "redis-py pipelined PEXPIRE", "redis-py PEXPIRE per round trip")
    # 100,000 round trips per tick (a timer per stream): not worth timing.
    if not (impl.endswith("per round trip") and held > 10_000)
]


@pytest.mark.parametrize(
    "impl, held", HEARTBEAT_CASES, ids=[f"{i}-held={h}" for i, h in HEARTBEAT_CASES]
)
def bench_heartbeat_tick(bench: Bench, impl: str, held: int) -> None:
    bench.benchmark.group = f"heartbeat tick, {held} held"
    # --benchmark-disable: a tenth.
    r, c = bench.run(_holding(bench, bench.size(held, held // 10)))
    # The plain rows' own locks, one per held stream, as the RFC (and the Go client) keeps them: lbs
    # holds them all under its one lease, so there are none to extend unless set here.
    locks = [lock_key(c.service, h.entry_id) for h in c.held_streams()]
    if impl != "lbs heartbeat":
        bench.run(_locked(r, locks, c.lock_owner))

    async def tick_lbs() -> int:
        return await c.heartbeat()

    # The plain ticks return how many locks they did not find (lost), as lbs's does.
    async def tick_pipeline() -> int:
        pipe = r.pipeline(transaction=False)
        for k in locks:
            pipe.pexpire(k, 600_000)
        return sum(not extended for extended in await pipe.execute())

    async def tick_one_by_one() -> int:
        lost = 0
        for k in locks:
            lost += not await r.pexpire(k, 600_000)
        return lost

    fn = {
        "lbs heartbeat": tick_lbs,
        "redis-py pipelined PEXPIRE": tick_pipeline,
        "redis-py PEXPIRE per round trip": tick_one_by_one,
    }[impl]
    client_cpu: list[float] = []

    def tick() -> int:
        cpu0 = time.process_time()
        lost = bench.run(fn())
        client_cpu.append(time.process_time() - cpu0)
        return lost

    server0 = bench.run(_server_cpu(r))
    lost = bench(tick, rounds=5)
    server_cpu = bench.run(_server_cpu(r)) - server0
    assert lost == 0
    # The lower bound lbs's tick is compared with.
    bench.extra_info["baseline"] = impl == "redis-py pipelined PEXPIRE"
    # Client CPU: the best tick (process_time of this process, event loop
    # included). Redis CPU: the server's whole time over all ticks, per tick.
    bench.extra_info["client_cpu_ms_per_tick"] = round(min(client_cpu) * 1e3, 1)
    bench.extra_info["redis_cpu_ms_per_tick"] = round(server_cpu / len(client_cpu) * 1e3, 1)
