"""The PySpark data source "lbs" in a real Spark (local mode) against real Redis 8.6 and 7.0."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the lbs[spark] extra")

import lbs  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One Spark session for the run: local[2, 4] (4 attempts per task, for injected failures), UI off."""
    from pyspark.sql import SparkSession

    from lbs.spark import LbsDataSource

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2, 4]").appName("lbs-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LbsDataSource)
    try:
        yield session
    finally:
        session.stop()


def _frame(spark: Any, streams: int, rows: int, partitions: int = 2) -> Any:
    data = [(f"ds-{i % streams}", i, f"payload-{i}") for i in range(streams * rows)]
    return spark.createDataFrame(data, "stream string, n long, body string").repartition(partitions)


def _lbs_names(r: redis.Redis, service: str) -> list[str]:
    names = []
    for _, fields in r.xrange(lbs.input_stream(service)):
        name, _info, _err = lbs.try_decode_input(fields[b"lbs-input"])
        names.append(name)
    return sorted(names)


def test_the_sink_appends_every_row_and_registers_each_stream_once(
        spark: Any, redis_server: Any, service: str) -> None:
    df = _frame(spark, streams=3, rows=100)
    df.write.format("lbs").option("url", redis_server.url).option("SERVICE", service).mode("append").save()
    with redis.Redis.from_url(redis_server.url) as r:
        assert [r.xlen(f"ds-{i}") for i in range(3)] == [100, 100, 100]
        assert _lbs_names(r, service) == ["ds-0", "ds-1", "ds-2"]
        ((_, first),) = r.xrange("ds-0", count=1)
        assert set(first) == {b"n", b"body"}
        for k in ("ds-0", "ds-1", "ds-2"):
            r.delete(k)


def test_overwrite_is_refused(spark: Any, redis_server: Any, service: str) -> None:
    df = _frame(spark, streams=1, rows=1)
    with pytest.raises(Exception, match="append-only"):
        df.write.format("lbs").option("url", redis_server.url).option("service", service).mode("overwrite").save()


def test_a_missing_option_is_a_clear_error(spark: Any, redis_server: Any) -> None:
    df = _frame(spark, streams=1, rows=1)
    with pytest.raises(Exception, match="needs option 'service'"):
        df.write.format("lbs").option("url", redis_server.url).mode("append").save()


@pytest.mark.parametrize("server", ["redis_server", "redis7_server"])
def test_a_retried_task_writes_no_duplicates_on_8_6_and_documented_ones_on_7(
        spark: Any, service: str, server: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(server).url
    streams = [f"{service}-retry-{i}" for i in range(2)]
    data = [(streams[i % 2], i) for i in range(4_000)]
    df = spark.createDataFrame(data, "stream string, n long").repartition(2)
    # Each partition's first attempt dies after 500 rows (already sent); Spark retries it.
    (df.write.format("lbs").option("url", url).option("service", service).option("_failAfterRows", "500")
     .mode("append").save())
    with redis.Redis.from_url(url) as r:
        total = sum(r.xlen(s) for s in streams)
        if server == "redis_server":
            assert total == 4_000  # XADD IDMP: the replayed rows returned their first entries
        else:
            assert total == 4_000 + 2 * 500  # at-least-once: each retried partition re-sent its 500
        assert _lbs_names(r, service) == sorted(streams)
        r.delete(*streams)
