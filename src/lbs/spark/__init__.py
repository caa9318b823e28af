"""The PySpark data source ``lbs`` (extra ``lbs-streams[spark]``): sink, batch reader, streaming reader.

``import lbs`` never imports this package; ``import lbs.spark`` needs
pyspark >= 4.0 and pyarrow. Register the source once per session::

    from lbs.spark import LbsDataSource
    spark.dataSource.register(LbsDataSource)
    df.write.format("lbs").option("url", "redis://...").option("service", "orders").mode("append").save()

**Connection** (every mode): ``url`` (``redis://``, ``rediss://`` for TLS,
``redis+cluster://`` / ``rediss+cluster://`` for Redis Cluster), ``cluster``
(``none`` or ``oss``), ``username``, ``password``, and redis-py's
``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``,
``ssl_check_hostname``. Options are case-insensitive strings.

**Sink** (``df.write`` / ``df.writeStream``): rows name a data stream (column
``stream``, or option ``streamColumn``) and carry its payload columns, which
become the entry's fields (as strings; nulls skipped). Each partition appends
its rows with pipelined XADD encoded by lbs's core from the Arrow batches;
the driver then registers every data stream the job touched in the service's
LBS, once (``register=false`` only appends; ``registerOnly=true`` only
registers). On Redis >= 8.6 it is exactly-once: every row is
``XADD ... IDMP <run tag>:<batch>:<partition>:<chunk> <index>``, chunks no
larger than the stream's IDMP max size (``idmpMaxSize`` / ``idmpDuration``
set it with XCFGSET, which clears the stream's tracked ids, so only when
they differ), so a retried task's rows return their first entries. The run
tag is option ``runTag``, the streaming query's id, or one drawn per batch
job on the driver. It needs deterministic partitions and a retry within the
IDMP duration. On older servers the sink is at-least-once (logged).
``mode("overwrite")`` is refused: an LBS is append-only.

**Batch reader** (``spark.read``): ``streams`` (comma-separated), ``pattern``
(a SCAN match), or ``source`` (``lbs`` or ``dlq``) with ``service``. Rows are
``stream, id, fields`` (a map), or the columns of a given schema (``stream``,
``id`` and fields by name, cast; a value that does not parse is null). One
partition per stream, or per ID range of ``splitEntries`` entries; every
range ends at the newest id when the read was planned.

**Streaming reader** (``spark.readStream``): the same sources and rows, plus
``group`` (required: a consumer group of its own per query),
``startingOffsets`` (``earliest``, the default, or ``latest``) and
``maxEntriesPerTrigger`` (a total over the streams). Offsets are ``{stream: last id}``; a
restarted query replays its batch from the group's pending entries. Acknowledgement
(XACK in ``commit``) lags one batch; end-to-end exactly-once needs the IDMP
sink (or another idempotent one).

Connections open inside ``read()`` / ``write()`` / ``commit()``, never
pickled. Executors must be able to import ``lbs`` (install it there; in a
notebook, ``pyspark.cloudpickle.register_pickle_by_value(lbs)``). Do not run
lbs consumers inside Spark executors: task retries, speculation and lost
executors would leave duplicate or orphaned consumers; workers stay ordinary
processes.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pyspark

if int(pyspark.__version__.split(".")[0]) < 4:  # before the Python Data Source API
    raise ImportError(
        f"lbs.spark needs PySpark >= 4.0 (the Python Data Source API); this is {pyspark.__version__}"
    )

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceWriter
from pyspark.sql.types import StructType

from ..exceptions import ConfigurationError
from . import _optionlist
from ._options import Connection
from ._read import LbsReader, default_schema
from ._readstream import LbsStreamReader
from ._sink import LbsStreamWriter, LbsWriter, SinkOptions

__all__ = ["Connection", "LbsDataSource", "default_schema", "local_session"]


class LbsDataSource(DataSource):
    """The data source ``lbs``: ``spark.read``/``readStream`` and ``df.write``/``writeStream`` ``.format("lbs")``."""

    @classmethod
    def name(cls) -> str:
        return "lbs"

    def schema(self) -> StructType:
        return default_schema()

    def reader(self, schema: StructType) -> LbsReader:
        _optionlist.check(self.options, "read")
        return LbsReader(self.options, schema)

    def streamReader(self, schema: StructType) -> LbsStreamReader:
        _optionlist.check(self.options, "readStream")
        return LbsStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _optionlist.check(self.options, "write")
        if overwrite:
            raise ConfigurationError(
                "the lbs sink is append-only: mode('overwrite') is not supported; "
                "use mode('append')"
            )
        return LbsWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> LbsStreamWriter:
        _optionlist.check(self.options, "writeStream")
        if overwrite:
            raise ConfigurationError(
                "the lbs sink is append-only: outputMode('complete') is not supported"
            )
        return LbsStreamWriter(SinkOptions.parse(self.options), schema)


def local_session(master: str = "local[2]", app_name: str = "lbs") -> Any:
    """A quiet local SparkSession with the ``lbs`` source registered.

    UI off, driver bound to loopback, workers on this interpreter
    (``PYSPARK_PYTHON``), 2 shuffle partitions, logs at ERROR. Use
    ``local[N, R]`` to let a task be retried ``R - 1`` times. This is for
    demos, tests and notebooks; a cluster job builds its own session and calls
    ``spark.dataSource.register(LbsDataSource)``.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(LbsDataSource)
    return session
