"""A streaming query run as its own driver process (tests/integration/test_spark_restart.py kills it).

Arguments: url service inputs(comma-separated) checkpoint group options(JSON, for the sink). It
reads the input streams through the lbs source (consumer group ``group``) and writes each row to
``<input>-out`` through the lbs sink, with ``trigger(availableNow=True)``, then exits.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import functions as F

from lbs.spark import local_session


def main() -> None:
    url, service, inputs, checkpoint, group, options = sys.argv[1:7]
    spark = local_session("local[2]", app_name="lbs-restart")
    source = (
        spark.readStream.format("lbs")
        .schema("stream string, id string, n long")
        .option("url", url)
        .option("streams", inputs)
        .option("group", group)
        .load()
    )
    out = source.select(
        F.concat(source.stream, F.lit("-out")).alias("stream"), source.id.alias("src"), source.n
    )
    writer = (
        out.writeStream.format("lbs")
        .option("url", url)
        .option("service", service)
        .option("checkpointLocation", checkpoint)
    )
    for k, v in json.loads(options).items():
        writer = writer.option(k, v)
    writer.trigger(availableNow=True).start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
