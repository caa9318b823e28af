"""The Spark data source beside plain redis-py, in one run: 1,000,000 small rows, 2 partitions.

* **sink**: ``df.write.format("lbs")`` (XADD IDMP on, so exactly-once; and
  with ``idmp=false``) against what a Spark job writes without lbs, redis-py
  pipelines of XADD in ``foreachPartition`` (at least once: a retried task
  writes its rows again), and against a plain redis-py pipeline of XADD
  outside Spark (one process, the baseline), all ``execute()`` every 1,000
  rows, same rows, same server;
* **reader**: ``spark.read.format("lbs")`` of the two streams, counted by
  Spark (a Python source cannot prune columns, so every row is read and
  converted to Arrow) against plain redis-py XRANGE pages of 1,000 outside
  Spark.

* **many streams**: a batch read of 10,000 streams of 10 entries found by a
  pattern (lbs packs them into a few partitions), beside a redis-py SCAN and
  pipelined XRANGE in one process; and a streaming trigger's planning in the
  driver over those streams (which moved, their ends, the tasks, the commit),
  beside a SCAN and a pipelined XREVRANGE per stream, with Redis's CPU and
  commands per trigger.

Each row is ``stream`` (``<service>-s0`` or ``-s1``), ``n`` (a long) and
``body`` (a short string). The figure to read is ``extra_info.rows_per_s``
(``--benchmark-columns=mean`` and the JSON have it). Spark's job start is
part of every Spark round, as it is of every real job; one warm-up round
per case starts Spark's Python workers first. ``make test`` runs
each once on 20,000 rows (``--benchmark-disable``), so none can rot.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis

pytest.importorskip("pyspark", reason="the Spark benchmarks need the lbs-streams[spark] extra")

if TYPE_CHECKING:
    from .conftest import Bench

ROWS = 1_000_000
SMOKE_ROWS = 20_000
PARTITIONS = 2


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from lbs.spark import local_session

    session = local_session("local[2]", app_name="lbs-bench")
    try:
        yield session
    finally:
        session.stop()


def _rows(bench: Bench) -> int:
    return SMOKE_ROWS if bench.benchmark.disabled else ROWS


def _redis(bench: Bench) -> redis.Redis:
    """A plain (sync) redis-py client on ``bench.url``, closed at teardown."""
    r = redis.Redis.from_url(bench.url)
    bench.defer(r.close)
    return r


def _frame(spark: Any, service: str, rows: int) -> Any:
    from pyspark.sql import functions as F

    ids = spark.range(0, rows, numPartitions=PARTITIONS)
    return ids.select(
        F.concat(F.lit(f"{service}-s"), (ids.id % 2).cast("string")).alias("stream"),
        ids.id.alias("n"),
        F.lit("payload").alias("body"),
    )


def _append(r: redis.Redis, streams: list[str], rows: int, per_round: int) -> None:
    """The plain redis-py way: pipelined XADD of the rows, alternating streams, one ``execute()`` per round."""
    pipe = r.pipeline(transaction=False)
    for i in range(rows):
        pipe.xadd(streams[i % 2], {"n": i, "body": "payload"})
        if len(pipe) == per_round:
            pipe.execute()
    pipe.execute()


def _report(bench: Bench, rows: int, baseline: bool) -> None:
    bench.extra_info["baseline"] = baseline
    stats = getattr(bench.benchmark, "stats", None)
    if stats is not None and stats.stats.min:
        bench.extra_info["rows_per_s"] = round(rows / stats.stats.min)
        bench.extra_info["rows"] = rows


@pytest.mark.benchmark(group="spark sink: 1M rows, 2 partitions")
@pytest.mark.parametrize(
    "impl",
    [
        "lbs sink, IDMP (exactly-once)",
        "lbs sink, idmp=false",
        "redis-py XADD in foreachPartition",
        "redis-py pipeline XADD",
    ],
)
def bench_spark_sink(bench: Bench, spark: Any, impl: str) -> None:
    rows = _rows(bench)
    service = bench.service("spark-sink")
    streams = [f"{service}-s0", f"{service}-s1"]
    r = _redis(bench)
    df = _frame(spark, service, rows)

    def clean() -> None:
        r.delete(*streams, f"{service}-input")

    def with_lbs() -> None:
        (
            df.write.format("lbs")
            .option("url", bench.url)
            .option("service", service)
            .option("idmp", str("idmp=false" not in impl).lower())
            .mode("append")
            .save()
        )

    def plain() -> None:
        _append(r, streams, rows, 1_000)

    def for_each_partition() -> None:
        url = bench.url

        def write(rows: Any) -> None:  # what a Spark job writes without lbs: at least once
            import redis as redis_py

            with redis_py.Redis.from_url(url) as client:
                pipe = client.pipeline(transaction=False)
                for row in rows:
                    pipe.xadd(row.stream, {"n": row.n, "body": row.body})
                    if len(pipe) == 1_000:
                        pipe.execute()
                pipe.execute()

        df.foreachPartition(write)

    fn = {
        "redis-py pipeline XADD": plain,
        "redis-py XADD in foreachPartition": for_each_partition,
    }.get(impl, with_lbs)
    bench(fn, setup=clean, warmup_rounds=1)
    assert r.xlen(streams[0]) + r.xlen(streams[1]) == rows
    _report(bench, rows, baseline=fn is plain)


@pytest.mark.benchmark(group="spark reader: 1M rows, 2 partitions")
@pytest.mark.parametrize("impl", ["lbs reader (Spark)", "redis-py XRANGE"])
def bench_spark_reader(bench: Bench, spark: Any, impl: str) -> None:
    rows = _rows(bench)
    service = bench.service("spark-read")
    streams = [f"{service}-s0", f"{service}-s1"]
    r = _redis(bench)
    _append(r, streams, rows, 10_000)

    def with_lbs() -> int:
        df = (
            spark.read.format("lbs")
            .option("url", bench.url)
            .option("streams", ",".join(streams))
            .load()
        )
        return int(df.count())  # the source cannot prune: every row is read and converted

    def plain() -> int:
        n = 0
        for name in streams:
            start = "-"
            while True:
                page = r.xrange(name, start, "+", count=1_000)
                n += len(page)
                if len(page) < 1_000:
                    break
                start = "(" + page[-1][0].decode()
        return n

    fn = plain if impl.startswith("redis-py") else with_lbs
    assert bench(fn, warmup_rounds=1) == rows
    _report(bench, rows, baseline=fn is plain)


# ------------------------------------------------------------ many streams ---

STREAMS, SMOKE_STREAMS = 10_000, 300
PER_STREAM = 10


def _many(bench: Bench, r: redis.Redis, prefix: str) -> list[str]:
    """``STREAMS`` streams of ``PER_STREAM`` entries: per-session streams, as lbs sees them."""
    names = [f"{prefix}:{i}" for i in range(SMOKE_STREAMS if bench.benchmark.disabled else STREAMS)]
    pipe = r.pipeline(transaction=False)
    for name in names:
        for n in range(PER_STREAM):
            pipe.xadd(name, {"n": n})
        if len(pipe) >= 10_000:
            pipe.execute()
    pipe.execute()
    bench.defer(lambda: [r.delete(*names[i : i + 1_000]) for i in range(0, len(names), 1_000)])
    return names


def _redis_paid(r: redis.Redis) -> tuple[float, int]:
    """Redis's CPU seconds and commands so far (INFO cpu, commandstats)."""
    cpu = r.info("cpu")
    calls = sum(v["calls"] for v in r.info("commandstats").values())
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), int(calls)


@pytest.mark.benchmark(group="spark reader: 10,000 streams of 10 entries (pattern)")
@pytest.mark.parametrize("impl", ["lbs reader (Spark)", "redis-py SCAN + XRANGE per stream"])
def bench_spark_many_streams(bench: Bench, spark: Any, impl: str) -> None:
    """A batch read of many small streams found by a pattern: lbs packs them into partitions of
    about 10,000 entries (``tasks``); the baseline reads them in one process, 1,000 a round trip."""
    r = _redis(bench)
    prefix = bench.service("spark-many")
    names = _many(bench, r, prefix)

    def with_lbs() -> int:
        df = spark.read.format("lbs").option("url", bench.url).option("pattern", f"{prefix}:*")
        loaded = df.load()
        bench.extra_info["tasks"] = loaded.rdd.getNumPartitions()
        return int(loaded.count())

    def plain() -> int:
        found = sorted(k.decode() for k in r.scan_iter(match=f"{prefix}:*", count=1_000))
        n = 0
        for i in range(0, len(found), 1_000):
            pipe = r.pipeline(transaction=False)
            for name in found[i : i + 1_000]:
                pipe.xrange(name, "-", "+")
            n += sum(len(entries) for entries in pipe.execute())
        return n

    fn = plain if impl.startswith("redis-py") else with_lbs
    assert bench(fn, warmup_rounds=1) == len(names) * PER_STREAM
    _report(bench, len(names) * PER_STREAM, baseline=fn is plain)


_LBS, _PLAIN = "lbs streaming reader", "redis-py SCAN + XREVRANGE per stream"


@pytest.mark.benchmark(group="spark trigger over 10,000 streams, 10 moved: the driver's planning")
@pytest.mark.parametrize("impl", [_LBS, _PLAIN])
def bench_spark_trigger_quiet(bench: Bench, impl: str) -> None:
    _trigger(bench, impl, every=False)


@pytest.mark.benchmark(group="spark trigger over 10,000 streams, all moved: the driver's planning")
@pytest.mark.parametrize("impl", [_LBS, _PLAIN])
def bench_spark_trigger_busy(bench: Bench, impl: str) -> None:
    _trigger(bench, impl, every=True)


def _trigger(bench: Bench, impl: str, every: bool) -> None:
    """One micro-batch's planning in the driver, without a Spark job: the streaming reader's
    ``latestOffset`` (which streams moved, their new ends), ``partitions`` (tasks) and the previous
    batch's ``commit``, after one new entry in 10 streams or in every stream; the baseline does it
    the plain way (what lbs did before issue 46, pipelined): a SCAN, an XREVRANGE per stream, an
    XPENDING and an XACK per stream that moved, a task per stream that moved. ``redis_cpu_ms``
    and ``redis_commands`` are Redis's, per trigger."""
    from pyspark.sql.types import StructType

    from lbs.spark._readstream import LbsStreamReader

    r = _redis(bench)
    prefix = bench.service("spark-trigger")
    names = _many(bench, r, prefix)
    moving = names if every else names[:: max(1, len(names) // 10)][:10]
    reader = LbsStreamReader(
        {"url": bench.url, "pattern": f"{prefix}:*", "group": "bench"}, StructType()
    )
    bench.defer(reader.stop)
    state = {"end": reader.initialOffset()}
    state["end"] = reader.latestOffset(state["end"], None)
    reader.commit(state["end"])  # what the first batch's commit pays is not a trigger's
    ends = dict(state["end"])  # the plain way's offsets
    #: Per trigger: Redis's CPU seconds, its commands, the tasks planned.
    paid: list[tuple[float, int, int]] = []

    def move() -> None:
        pipe = r.pipeline(transaction=False)
        for name in moving:
            pipe.xadd(name, {"n": "new"})
        pipe.execute()

    def with_lbs() -> None:
        cpu, calls = _redis_paid(r)
        reader.commit(state["end"])
        end = reader.latestOffset(state["end"], None)
        tasks = len(reader.partitions(state["end"], end))
        state["end"] = end
        _count(cpu, calls, tasks)

    def plain() -> None:
        cpu, calls = _redis_paid(r)
        found = sorted(k.decode() for k in r.scan_iter(match=f"{prefix}:*", count=1_000))
        pipe = r.pipeline(transaction=False)
        for name in found:
            pipe.xrevrange(name, "+", "-", count=1)
        moved = {}
        for name, newest in zip(found, pipe.execute()):
            if newest and newest[0][0].decode() != ends.get(name):
                moved[name] = newest[0][0].decode()
        pipe = r.pipeline(transaction=False)  # the previous batch's acknowledgement
        for name in moved:
            pipe.xpending_range(name, "bench", min="-", max=moved[name], count=10_000)
        acks = r.pipeline(transaction=False)
        for name, pending in zip(moved, pipe.execute()):
            if pending:
                acks.xack(name, "bench", *[p["message_id"] for p in pending])
        acks.execute()
        ends.update(moved)
        _count(cpu, calls, len(moved))

    def _count(cpu: float, calls: int, tasks: int) -> None:
        cpu_after, calls_after = _redis_paid(r)
        # Less the two INFO calls of the second look.
        paid.append((cpu_after - cpu, calls_after - calls - 2, tasks))

    fn = plain if impl == _PLAIN else with_lbs
    bench(fn, setup=move, warmup_rounds=1)
    measured = paid[1:] or paid  # not the warm-up round
    bench.extra_info.update(
        baseline=fn is plain,
        redis_cpu_ms=round(1_000 * sum(p[0] for p in measured) / len(measured), 1),
        redis_commands=round(sum(p[1] for p in measured) / len(measured)),
        tasks=round(sum(p[2] for p in measured) / len(measured)),
    )
