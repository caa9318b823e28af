"""The Spark data source beside plain redis-py, in one run: 1,000,000 small rows, 2 partitions.

* **sink**: ``df.write.format("lbs")`` (XADD IDMP on, so exactly-once; and
  with ``idmp=false``) against a plain redis-py pipeline of XADD outside
  Spark (one process, ``execute()`` every 1,000 rows), same rows, same server;
* **reader**: ``spark.read.format("lbs")`` of the two streams, counted by
  Spark (a Python source cannot prune columns, so every row is read and
  converted to Arrow) against plain redis-py XRANGE pages of 1,000 outside
  Spark.

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
    "impl", ["lbs sink, IDMP (exactly-once)", "lbs sink, idmp=false", "redis-py pipeline XADD"]
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

    fn = plain if impl.startswith("redis-py") else with_lbs
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
