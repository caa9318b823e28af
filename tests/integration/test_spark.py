"""The PySpark data source "lbs" in a real Spark (local mode) against real Redis 8.6 and 7.0."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

import lbs  # noqa: E402

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One Spark session for the run: local[2, 4] (4 attempts per task, for injected failures), UI off."""
    from lbs.spark import local_session

    session = local_session("local[2, 4]", app_name="lbs-tests")
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
    spark: Any, redis_server: Any, service: str
) -> None:
    df = _frame(spark, streams=3, rows=100)
    df.write.format("lbs").option("url", redis_server.url).option("SERVICE", service).mode(
        "append"
    ).save()
    with redis.Redis.from_url(redis_server.url) as r:
        assert [r.xlen(f"ds-{i}") for i in range(3)] == [100, 100, 100]
        assert _lbs_names(r, service) == ["ds-0", "ds-1", "ds-2"]
        ((_, first),) = r.xrange("ds-0", count=1)
        assert set(first) == {b"n", b"body"}
        for k in ("ds-0", "ds-1", "ds-2"):
            r.delete(k)


def test_rows_without_a_stream_are_skipped_and_the_others_written(
    spark: Any, redis_server: Any, service: str
) -> None:
    name = f"{service}-named"
    df = spark.createDataFrame([(name, 1), (None, 2), (name, 3)], "stream string, n long")
    df.coalesce(1).write.format("lbs").option("url", redis_server.url).option(
        "service", service
    ).mode("append").save()
    with redis.Redis.from_url(redis_server.url) as r:
        assert [f[b"n"] for _, f in r.xrange(name)] == [b"1", b"3"]
        assert _lbs_names(r, service) == [name]
        r.delete(name)


def test_overwrite_is_refused(spark: Any, redis_server: Any, service: str) -> None:
    df = _frame(spark, streams=1, rows=1)
    with pytest.raises(Exception, match="append-only"):
        df.write.format("lbs").option("url", redis_server.url).option("service", service).mode(
            "overwrite"
        ).save()


def test_a_missing_option_is_a_clear_error(spark: Any, redis_server: Any) -> None:
    df = _frame(spark, streams=1, rows=1)
    with pytest.raises(Exception, match="needs option 'service'"):
        df.write.format("lbs").option("url", redis_server.url).mode("append").save()


@pytest.mark.parametrize("server", ["redis_server", "redis7_server"])
def test_a_retried_task_writes_no_duplicates_on_8_6_and_documented_ones_on_7(
    spark: Any, service: str, server: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server).url
    streams = [f"{service}-retry-{i}" for i in range(2)]
    data = [(streams[i % 2], i) for i in range(4_000)]
    df = spark.createDataFrame(data, "stream string, n long").repartition(2)
    # Each partition's first attempt dies after 500 rows (already sent); Spark retries it.
    (
        df.write.format("lbs")
        .option("url", url)
        .option("service", service)
        .option("_failAfterRows", "500")
        .mode("append")
        .save()
    )
    with redis.Redis.from_url(url) as r:
        total = sum(r.xlen(s) for s in streams)
        if server == "redis_server":
            assert total == 4_000  # XADD IDMP: the replayed rows returned their first entries
        else:
            assert total == 4_000 + 2 * 500  # at-least-once: each retried partition re-sent its 500
        assert _lbs_names(r, service) == sorted(streams)
        r.delete(*streams)


def _seed(url: str, service: str) -> list[str]:
    names = [f"{service}-r{i}" for i in range(3)]
    with redis.Redis.from_url(url) as r:
        for k, name in enumerate(names):
            for j in range(10 * (k + 1)):
                r.xadd(name, {"n": str(j), "who": name})
    return names


def test_the_reader_gives_exact_rows_for_a_list_and_a_pattern(
    spark: Any, redis_server: Any, service: str
) -> None:
    names = _seed(redis_server.url, service)
    reader = (
        spark.read.format("lbs").option("url", redis_server.url).option("streams", ",".join(names))
    )
    df = reader.load()
    assert df.schema.names == ["stream", "id", "fields"]
    rows = df.collect()
    # Small streams share a partition; one of about maxEntriesPerPartition entries each otherwise.
    assert len(rows) == 10 + 20 + 30 and df.rdd.getNumPartitions() == 1
    assert reader.option("maxEntriesPerPartition", "25").load().rdd.getNumPartitions() == 3
    with redis.Redis.from_url(redis_server.url) as r:
        expected = {
            (name, i.decode(), f[b"n"].decode()) for name in names for i, f in r.xrange(name)
        }
    assert {(row.stream, row.id, row.fields["n"]) for row in rows} == expected
    # A pattern, a typed schema, and a big stream split into ID ranges of 8 entries.
    typed = (
        spark.read.format("lbs")
        .schema("stream string, id string, n long")
        .option("url", redis_server.url)
        .option("pattern", f"{service}-r*")
        .option("splitEntries", "8")
        .load()
    )
    assert typed.rdd.getNumPartitions() == 2 + 3 + 4  # 10, 20, 30 entries in ranges of 8
    assert sorted(r.n for r in typed.filter(typed.stream == names[2]).collect()) == list(range(30))
    with redis.Redis.from_url(redis_server.url) as r:
        r.delete(*names)


def test_the_dead_letter_stream_is_readable(spark: Any, redis_server: Any, service: str) -> None:
    with redis.Redis.from_url(redis_server.url) as r:
        r.xadd(
            lbs.dead_letter_stream(service),
            {"_reason": "poison", "_failed_id": "1-0", "lbs-input": "{}"},
        )
    df = (
        spark.read.format("lbs")
        .schema("stream string, id string, _reason string")
        .option("url", redis_server.url)
        .option("source", "dlq")
        .option("service", service)
        .load()
    )
    ((stream, _id, reason),) = [tuple(r) for r in df.collect()]
    assert stream == lbs.dead_letter_stream(service) and reason == "poison"


def test_the_reader_needs_something_to_read(spark: Any, redis_server: Any) -> None:
    with pytest.raises(Exception, match="needs option 'streams'"):
        spark.read.format("lbs").option("url", redis_server.url).load().collect()


def _wave(r: redis.Redis, streams: list[str], start: int, count: int) -> None:
    pipe = r.pipeline(transaction=False)
    for n in range(start, start + count):
        pipe.xadd(streams[n % len(streams)], {"n": n, "body": f"event-{n}"})
    pipe.execute()


def test_a_stream_query_stopped_and_restarted_from_its_checkpoint_outputs_its_input_exactly_once(
    spark: Any, redis_server: Any, service: str, tmp_path: Any
) -> None:
    """Three waves: before the start, while running, while stopped; the restarted run also has a
    sink task that dies after 100 rows (and is retried). Output = input: no loss, no duplicates."""
    from pyspark.sql import functions as F

    inputs = [f"{service}-in-{i}" for i in range(2)]
    group = f"{service}-query"
    checkpoint = str(tmp_path / "checkpoint")

    def run(extra: dict[str, str]) -> Any:
        source = (
            spark.readStream.format("lbs")
            .schema("stream string, id string, n long, body string")
            .option("url", redis_server.url)
            .option("streams", ",".join(inputs))
            .option("group", group)
            .option("maxEntriesPerTrigger", "700")
            .load()
        )
        out = source.select(
            F.concat(source.stream, F.lit("-out")).alias("stream"),
            source.id.alias("src"),
            source.n,
            source.body,
        )
        writer = (
            out.writeStream.format("lbs")
            .option("url", redis_server.url)
            .option("service", service)
            .option("checkpointLocation", checkpoint)
        )
        for k, v in extra.items():
            writer = writer.option(k, v)
        return writer.start()

    def batches(query: Any) -> int:
        return sum(1 for p in query.recentProgress if p["numInputRows"])

    with redis.Redis.from_url(redis_server.url) as r:
        _wave(r, inputs, 0, 1_500)
        query = run({})
        query.processAllAvailable()
        _wave(r, inputs, 1_500, 300)  # while running
        query.processAllAvailable()
        query.stop()
        ran = batches(query)
        _wave(r, inputs, 1_800, 300)  # while stopped
        query = run({"_failAfterRows": "100"})
        query.processAllAvailable()
        query.stop()
        ran += batches(query)

        sent = {(name, i.decode()) for name in inputs for i, _ in r.xrange(name)}
        got = [
            (name[: -len("-out")], f[b"src"].decode(), int(f[b"n"]))
            for name in (s + "-out" for s in inputs)
            for _, f in r.xrange(name)
        ]
        assert len(sent) == 2_100
        assert len(got) == len(sent), "duplicates or losses"
        assert {(s, i) for s, i, _ in got} == sent
        assert sorted(n for _, _, n in got) == list(range(2_100))
        # Each micro-batch registers the streams it touched, once: a retried task adds nothing.
        registered = _lbs_names(r, service)
        assert set(registered) == {s + "-out" for s in inputs}
        assert ran >= 3 and len(registered) <= 2 * ran
        # The last batch stays pending until a next run acknowledges it (one-batch lag), no more.
        pending = sum(r.xpending(name, group)["pending"] for name in inputs)
        assert 0 <= pending <= 700


def test_a_stream_query_needs_its_own_group(spark: Any, redis_server: Any) -> None:
    query = (
        spark.readStream.format("lbs")
        .option("url", redis_server.url)
        .option("streams", "x")
        .load()
        .writeStream.format("noop")
        .start()
    )
    try:
        with pytest.raises(Exception, match="needs option 'group'"):
            query.awaitTermination(
                120
            )  # the reader is built once the query runs: its error ends it
    finally:
        query.stop()


def test_sink_and_reader_on_a_cluster(spark: Any, redis_cluster: Any, service: str) -> None:
    """redis+cluster:// routes every stream's rows to the master owning its slot, both ways."""
    url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    streams = [f"{service}-c{i}" for i in range(6)]  # no hash tag: spread over the masters
    data = [(streams[i % 6], i) for i in range(3_000)]
    spark.createDataFrame(data, "stream string, n long").repartition(2).write.format("lbs").option(
        "url", url
    ).option("service", service).option("_failAfterRows", "700").mode("append").save()
    client = redis.RedisCluster.from_url(redis_cluster.url)
    try:
        assert len({client.keyslot(s) // 5462 for s in streams}) > 1, (
            "the streams should span masters"
        )
        assert [client.xlen(s) for s in streams] == [
            500
        ] * 6  # the retried partitions added nothing
        assert _lbs_names(client, service) == sorted(streams)
        df = (
            spark.read.format("lbs")
            .schema("stream string, id string, n long")
            .option("url", redis_cluster.url)
            .option("cluster", "oss")
            .option("streams", ",".join(streams))
            .load()
        )
        assert sorted(r.n for r in df.collect()) == list(range(3_000))
    finally:
        client.delete(*streams)
        client.close()
