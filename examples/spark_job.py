"""A complete Spark job with lbs: write the work, read entries and dead letters back, and
stream the workers' results into a report; then it stops by itself.

    spark-submit --master 'local[2]' examples/spark_job.py [REDIS_URL [CHECKPOINT_DIR]]

REDIS_URL defaults to $LBS_URL, then redis://localhost:6379/0 (as the ``lbs`` command).
CHECKPOINT_DIR (default $LBS_CHECKPOINT, then /tmp/lbs-spark-job-checkpoint) is where the
streaming query keeps its offsets: keep it between runs and each run goes on where the last
stopped, no result written twice. Executors must be able to import lbs (README, "Spark").
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from lbs.spark import LbsDataSource


def main(url: str, checkpoint: str) -> None:
    spark = SparkSession.builder.appName("lbs-spark-job").getOrCreate()
    spark.dataSource.register(LbsDataSource)

    # 1. Write the work: each row goes to the data stream its "stream" column names (payload
    #    columns become fields), then each touched stream is registered once in "orders-input".
    events = spark.createDataFrame(
        [("session-1", "click", 3), ("session-2", "buy", 9)],
        "stream string, kind string, amount long",
    )
    events.write.format("lbs").option("url", url).option("service", "orders").mode("append").save()

    # 2. Read entries back (typed columns picked from the fields), or the dead letters with
    #    their reasons.
    clicks = (
        spark.read.format("lbs")
        .schema("stream string, id string, kind string, amount long")
        .option("url", url)
        .option("pattern", "session-*")
        .load()
    )
    dead = (
        spark.read.format("lbs")
        .option("url", url)
        .option("source", "dlq")
        .option("service", "orders")
        .load()
    )  # rows: stream, id, fields (a map)
    print("entries:", sorted((row.stream, row.kind, row.amount) for row in clicks.collect()))
    print("dead letters:", dead.count())

    # 3. Stream: results written by the workers, read as they come, written on exactly once.
    #    availableNow: take what is there now, in as many batches as it needs (PySpark >= 4.2;
    #    one batch before), then stop (a job that runs for ever leaves it out and keeps awaiting).
    query = (
        spark.readStream.format("lbs")
        .option("url", url)
        .option("streams", "results")
        .option("group", "daily-report")  # a consumer group of the query's own
        .load()
        .selectExpr("'report' AS stream", "id AS src", "fields['total'] AS total")
        .writeStream.format("lbs")
        .option("url", url)
        .option("service", "reports")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print("report batches:", sum(1 for p in query.recentProgress if p["numInputRows"]))
    spark.stop()


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LBS_URL", "redis://localhost:6379/0"),
        sys.argv[2]
        if len(sys.argv) > 2
        else os.environ.get("LBS_CHECKPOINT", "/tmp/lbs-spark-job-checkpoint"),
    )
