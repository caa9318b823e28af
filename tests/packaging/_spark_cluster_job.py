"""The job test_spark_cluster.py submits to its standalone cluster (run by spark-submit, from a
working directory outside the tree):

    spark-submit --master spark://HOST:PORT _spark_cluster_job.py \
        REDIS_URL RESULT_JSON CHECKPOINT ROWS STREAMS PARTITIONS

1. writes ROWS rows (row i: stream ``cj-<i % STREAMS, 3 digits>``, field ``n`` = i; partition p
   holds rows p * ROWS / PARTITIONS onwards, in order) through the lbs sink to service ``cluster``.
   A Python UDF before the sink sleeps every 100 rows, so that the write lasts long enough for the
   test to kill a worker in the middle, and records in the hash ``job:attempts`` where each task
   attempt runs (``<partition>.<attempt>`` -> the executor's working directory, ``<worker dir>/
   <app id>/<executor id>``);
2. reads the rows back with the batch reader (pattern ``cj-*``) and counts them;
3. copies them with the streaming reader (``trigger(availableNow=True)``) through the lbs sink
   into ``out-cj-*`` (service ``copy``);

then writes what it counted to RESULT_JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import redis
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lbs.spark import LbsDataSource

#: Rows per Arrow batch (the sink's) and per pause of PAUSE seconds (2,500 rows: at least 2.5 s).
BATCH, PAUSE = 100, 0.1
ROW_SCHEMA = "stream string, id string, n long"


def slowly(url: str) -> Any:
    """The write's Python step (a UDF: n as it came): every BATCH rows, where the task attempt runs
    is recorded and it sleeps PAUSE (a plain Python UDF: mapInArrow would need pandas)."""

    def step(n: int) -> int:
        if n % BATCH == 0:
            ctx = TaskContext.get()
            assert ctx is not None
            with redis.Redis.from_url(url) as r:
                r.hset("job:attempts", f"{ctx.partitionId()}.{ctx.attemptNumber()}", os.getcwd())
            time.sleep(PAUSE)
        return n

    return F.udf(step, "long")


def main(url: str, result: str, checkpoint: str, rows: int, streams: int, partitions: int) -> None:
    spark = (
        SparkSession.builder.appName("lbs-cluster-job")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH))
        # The pipes to and from Python workers flush when their buffer is full (64 KiB): a partition
        # (about 50 KB here) would reach the sink in one go, at its end. Small buffers: a batch at
        # a time, so the sink writes as the rows come and a task killed mid-write has written some.
        .config("spark.buffer.size", "1024")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.dataSource.register(LbsDataSource)

    # 1. The write, slowed down; each stream registered once in cluster-input at the commit.
    work = (
        spark.range(0, rows, numPartitions=partitions)
        .selectExpr(f"format_string('cj-%03d', id % {streams}) AS stream", "id AS n")
        .withColumn("n", slowly(url)("n"))
    )
    work.write.format("lbs").option("url", url).option("service", "cluster").mode("append").save()

    # 2. The batch reader: every row, each (stream, n) once.
    back = (
        spark.read.format("lbs")
        .schema(ROW_SCHEMA)
        .option("url", url)
        .option("pattern", "cj-*")
        .load()
        .agg(F.count("*").alias("rows"), F.count_distinct("stream", "n").alias("distinct"))
        .first()
    )
    assert back is not None

    # 3. The streaming reader: whatever is there now, copied through the sink, then it stops.
    query = (
        spark.readStream.format("lbs")
        .schema(ROW_SCHEMA)
        .option("url", url)
        .option("pattern", "cj-*")
        .option("group", "copy")
        .load()
        .selectExpr("concat('out-', stream) AS stream", "n")
        .writeStream.format("lbs")
        .option("url", url)
        .option("service", "copy")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()

    report = {
        "app": spark.sparkContext.applicationId,
        "batch_rows": back["rows"],
        "batch_distinct": back["distinct"],
        "streamed_rows": sum(p["numInputRows"] for p in query.recentProgress),
        "stream_batches": sum(1 for p in query.recentProgress if p["numInputRows"]),
    }
    with open(result, "w") as f:
        json.dump(report, f)
    spark.stop()


if __name__ == "__main__":
    url, result, checkpoint, rows, streams, partitions = sys.argv[1:7]
    main(url, result, checkpoint, int(rows), int(streams), int(partitions))
