"""Redis CPU per message at a steady rate: lbs ``run()`` beside the plain redis-py loop, in one run.

A steady producer (:func:`benchmarks.data.steady`: 500 or 2,000 registrations a
second for 10 s, sent in ticks of 5 ms, each carrying its send time) on its own
connection in the same process, and one consumer whose handler does nothing
but record the time it started:

* **lbs**: ``lbs.Client(url, service, "bench", lbs.Config())`` with the
  installed plugins loaded (entry points, as an application gets them), and
  ``run(handler)`` (no ``concurrency``; ``handle_signals=False``, so pytest
  keeps its own). The producer is ``lbs.Producer.add_streams`` (one MULTI/EXEC
  of XADDs per tick).
* **plain** (the baseline): the loop a user would write with redis-py, one
  consumer, nothing in flight ahead: ``XREADGROUP GROUP g bench COUNT 50 BLOCK
  1000 STREAMS s >`` (50: what lbs reads at most with the defaults, half of
  ``max_streams``), record the time of each entry, one ``XACK`` of the batch's
  ids, again. The producer XADDs the same ``lbs-input`` payload
  (``lbs.encode_input``) to the same stream, one non-transactional pipeline
  per tick.

The consumer starts and idles 0.5 s before the window opens; the window (one
:class:`benchmarks.cost.Window`) opens just before the first publish and
closes when every message is finished (lbs: ``stats.finished``; plain: acked),
so every read, lock, done and ack of the run's messages is in it, and
nothing of the start-up or the close. ``extra_info`` (the median round by
Redis CPU per message): ``messages``, ``redis_cpu_us_per_message``,
``commands_per_message`` (INFO commandstats delta per message: ``{cmd:
[calls, usec]}``), every round's ``redis_cpu_us_per_message_rounds``, and
``p50_ms``/``p99_ms`` dispatch latency (publish to handler start) over all
rounds. The baseline row has ``extra_info["baseline"] = True``
(``python -m benchmarks.report`` prints each row beside it).

With ``--benchmark-disable`` (``make test``), one round of 0.5 s per row.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import lbs
from lbs._bench import plain_group

from .cost import Cost, Window, percentile
from .data import steady

if TYPE_CHECKING:
    from .conftest import Bench

RATES = (500, 2_000)
SECONDS, ROUNDS = 10.0, 3
#: Idle time between the consumer's start and the window.
SETTLE = 0.5
#: What the plain loop reads at most: lbs's default read size (half of ``Config().max_streams``).
COUNT = lbs.Config().max_streams // 2
#: How long a round may take past its publishing before it fails.
SLACK = 60.0


@dataclass
class Round:
    messages: int
    cost: Cost
    latencies: list[float]

    @property
    def cpu_us_per_message(self) -> float:
        return self.cost.cpu / self.messages * 1e6


async def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + SLACK
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not finished within {SLACK} s: {what}")
        await asyncio.sleep(0.002)


async def rate_lbs(bench: Bench, service: str, rate: int, seconds: float) -> Round:
    seen: list[float] = []

    async def handle(note: lbs.Notification) -> None:
        seen.append(time.perf_counter() - float(note.info["t"]))

    pub, admin = bench.redis(), bench.redis()
    await pub.ping()
    c = lbs.Client(bench.url, service, "bench", lbs.Config())
    await c.start()
    runner = asyncio.create_task(c.run(handle, handle_signals=False))
    try:
        await asyncio.sleep(SETTLE)
        producer = lbs.Producer(pub, service)
        window = await Window.open(admin)
        total = await steady(producer.add_streams, rate, seconds)
        await _until(lambda: c.stats.finished >= total or runner.done(), "lbs run()")
        cost = await window.close()
    finally:
        await c.close()
        await runner
    assert len(seen) == total, (len(seen), total)
    return Round(total, cost, seen)


async def rate_plain(bench: Bench, service: str, rate: int, seconds: float) -> Round:
    r, pub, admin = bench.redis(), bench.redis(), bench.redis()
    stream, group = await plain_group(r, service)
    await pub.ping()
    seen: list[float] = []
    acked = 0

    async def consume() -> None:
        nonlocal acked
        while True:
            reply: Any = await r.xreadgroup(group, "bench", {stream: ">"}, count=COUNT, block=1000)
            now = time.perf_counter()
            entries: list[Any] = [
                e
                for _, es in (reply.items() if isinstance(reply, dict) else reply or [])
                for e in (es[0] if isinstance(reply, dict) else es)
            ]
            if entries:
                for _, fields in entries:
                    _, info = lbs.decode_input(fields[b"lbs-input"])
                    seen.append(now - float(info["t"]))
                await r.xack(stream, group, *(entry_id for entry_id, _ in entries))
                acked += len(entries)

    async def publish(batch: list[tuple[str, dict[str, Any]]]) -> None:
        pipe = pub.pipeline(transaction=False)
        for name, info in batch:
            pipe.xadd(stream, {"lbs-input": lbs.encode_input(name, info)})
        await pipe.execute()

    consumer = asyncio.create_task(consume())
    try:
        await asyncio.sleep(SETTLE)
        window = await Window.open(admin)
        total = await steady(publish, rate, seconds)
        await _until(lambda: acked >= total or consumer.done(), "plain loop")
        cost = await window.close()
    finally:
        consumer.cancel()  # blocked in XREADGROUP: its connection is dropped, which ends the BLOCK
        await asyncio.gather(consumer, return_exceptions=True)
    assert acked == total, (acked, total)
    return Round(total, cost, seen)


SIDES: dict[str, Callable[[Bench, str, int, float], Awaitable[Round]]] = {
    "lbs run() defaults+installed plugins": rate_lbs,
    "redis-py XREADGROUP BLOCK + XACK": rate_plain,
}
BASELINE = "redis-py XREADGROUP BLOCK + XACK"
CASES = [(impl, rate) for rate in RATES for impl in SIDES]


@pytest.mark.parametrize("impl, rate", CASES, ids=[f"{i}-{r}/s" for i, r in CASES])
def bench_steady_rate(bench: Bench, impl: str, rate: int) -> None:
    bench.benchmark.group = f"steady {rate} messages/s, Redis CPU per message"
    disabled = bench.benchmark.disabled
    seconds = 0.5 if disabled else SECONDS
    rounds: list[Round] = []

    async def measured(service: str) -> None:
        rounds.append(await SIDES[impl](bench, service, rate, seconds))

    bench(measured, setup=lambda: bench.service(f"rate{rate}"), rounds=1 if disabled else ROUNDS)
    median = sorted(rounds, key=lambda x: x.cpu_us_per_message)[len(rounds) // 2]
    ms = sorted(x * 1000 for rd in rounds for x in rd.latencies)
    info = bench.extra_info
    info["baseline"] = impl == BASELINE
    info["fixed_duration"] = True
    info["messages"] = median.messages
    info["redis_cpu_us_per_message"] = round(median.cpu_us_per_message, 1)
    info["redis_cpu_us_per_message_rounds"] = [round(x.cpu_us_per_message, 1) for x in rounds]
    info["p50_ms"] = round(percentile(ms, 0.5), 3)
    info["p99_ms"] = round(percentile(ms, 0.99), 3)
    info["messages_per_s"] = round(median.messages / median.cost.seconds, 1)
    info["commands_per_message"] = median.cost.per(median.messages)
    info["window_s"] = round(statistics.fmean(x.cost.seconds for x in rounds), 2)
