"""The PySpark data source ``lbs`` (extra ``lbs[spark]``): the sink and the batch reader.

``import lbs`` never imports this module; ``import lbs.spark`` needs pyspark
>= 4.0 and pyarrow. Register the source once per session::

    from lbs.spark import LbsDataSource
    spark.dataSource.register(LbsDataSource)
    df.write.format("lbs").option("url", "redis://...").option("service", "orders").mode("append").save()

**Batch reader** (``spark.read.format("lbs")``): option ``streams``
(comma-separated), ``pattern`` (a SCAN match), or ``source`` (``lbs`` or
``dlq``) with ``service``. Rows are ``stream, id, fields`` (a map), or the
columns of a given schema (``stream``, ``id`` and fields by name, cast to
simple types). One partition per stream, or per ID range of
``splitEntries`` entries; every range ends at the newest id when the read
was planned, so a retried task reads the same rows.

**Sink.** Rows name a data stream (column ``stream``, or option
``streamColumn``) and carry its payload columns, which become the entry's
fields (as strings; nulls skipped). Each partition appends its rows with
pipelined XADD, Arrow batches in; the driver then registers every data
stream the job touched in the service's LBS, once (option ``register``:
``true``, the default, or ``false`` to only append; ``registerOnly`` to
register the streams without appending rows).

**Exactly once on Redis >= 8.6.** Spark retries tasks, and a plain XADD sink
writes a retried partition twice. With XADD IDMP every row gets a producer
id ``<run tag>:<batch>:<partition>:<chunk>`` and an entry id (its index in
the chunk); a replayed row returns the original entry instead of adding one.
Chunks are no larger than the stream's IDMP max size (``XINFO STREAM``), so
no id is evicted before a retry can use it, and a retry must come within the
stream's IDMP duration (options ``idmpMaxSize`` / ``idmpDuration`` set them
with XCFGSET when they differ; setting them clears the stream's tracked
ids). The run tag is the streaming query's id, or option ``runTag``, or one
drawn per write job on the driver (so every retry of the job shares it). This
needs deterministic partitions: the same rows in the same order on a retry.
On older servers the sink is at-least-once (logged once per writer).

``mode("overwrite")`` is refused: an LBS is append-only. Options are
case-insensitive strings. Connections open inside ``write()`` and
``commit()``, never when the writer is pickled. Executors must be able to
import ``lbs`` (install it there, or ``pyspark.cloudpickle.register_pickle_by_value``
for notebooks). Do not run lbs consumers inside Spark executors: task
retries, speculation and lost executors would leave duplicate or orphaned
consumers; workers stay ordinary processes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from . import _keys
from ._connection import parse_version
from .exceptions import ConfigurationError

__all__ = ["LbsDataSource", "default_schema"]

log = logging.getLogger("lbs.spark")

FLUSH_ROWS = 1_000
IDMP_SERVER = (8, 6)


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ConfigurationError(f"option {name!r} must be true or false, got {raw!r}")


@dataclass(frozen=True)
class SinkOptions:
    url: str
    service: str
    stream_column: str = "stream"
    register: bool = True
    append: bool = True
    run_tag: str | None = None
    idmp: bool = True
    idmp_max_size: int | None = None
    idmp_duration: int | None = None
    fail_after_rows: int | None = None  # tests: raise in a partition's first attempt after N rows

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = {k.lower(): v for k, v in options.items()}
        for required in ("url", "service"):
            if not opts.get(required):
                raise ConfigurationError(f"the lbs sink needs option {required!r}")
        _keys.validate_service(opts["service"])

        def number(name: str) -> int | None:
            raw = opts.get(name.lower())
            if raw is None:
                return None
            try:
                value = int(raw)
            except ValueError:
                raise ConfigurationError(f"option {name!r} must be an integer, got {raw!r}") from None
            if value < 1:
                raise ConfigurationError(f"option {name!r} must be at least 1, got {value}")
            return value

        register_only = _flag(opts, "registerOnly", False)
        return cls(url=opts["url"], service=opts["service"], stream_column=opts.get("streamcolumn", "stream"),
                   register=_flag(opts, "register", True) or register_only, append=not register_only,
                   run_tag=opts.get("runtag") or None, idmp=_flag(opts, "idmp", True),
                   idmp_max_size=number("idmpMaxSize"), idmp_duration=number("idmpDuration"),
                   fail_after_rows=number("_failAfterRows"))


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one partition wrote: rows appended and the data streams it touched."""

    rows: int = 0
    streams: list[str] = field(default_factory=list)
    exactly_once: bool = False


def _cmd(target: Any, *args: Any) -> Any:
    """``execute_command`` on a client or pipeline (raw, for XADD IDMP and XCFGSET)."""
    return target.execute_command(*args)


def _commits(messages: list[WriterCommitMessage | None]) -> list[SinkCommit | None]:
    return [m if isinstance(m, SinkCommit) else None for m in messages]


def _server_version(r: redis.Redis) -> tuple[int, ...]:
    try:
        return parse_version(r.info("server").get("redis_version", "0"))
    except redis.RedisError:
        return ()


class _SinkCore:
    """The write path shared by the batch and the streaming writer."""

    def __init__(self, opts: SinkOptions, schema: StructType, run_tag: str) -> None:
        self.opts = opts
        self.run_tag = run_tag
        names = [f.name for f in schema.fields]
        if opts.stream_column not in names:
            raise ConfigurationError(f"the lbs sink needs a column {opts.stream_column!r} naming each row's data "
                                     f"stream (option streamColumn); the columns are {names}")
        self.payload_columns = [n for n in names if n != opts.stream_column]

    def write_batches(self, batches: Iterator[Any], batch_id: str) -> SinkCommit:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        first_attempt = ctx is None or ctx.attemptNumber() == 0
        r = redis.Redis.from_url(self.opts.url)
        try:
            exactly_once = self.opts.idmp and _server_version(r) >= IDMP_SERVER
            if not exactly_once:
                log.warning("lbs sink: Redis without XADD IDMP (needs 8.6) or idmp=false: at-least-once; "
                            "a retried task appends its rows again")
            seen: dict[str, int] = {}  # stream -> rows so far in this partition
            max_size: dict[str, int] = {}
            rows = 0
            pipe = r.pipeline(transaction=False)
            for batch in batches:
                columns = batch.to_pydict()
                streams = columns[self.opts.stream_column]
                payload = [(name, columns[name]) for name in self.payload_columns]
                for i, stream in enumerate(streams):
                    if stream is None:
                        continue
                    stream = str(stream)
                    if stream not in seen:
                        seen[stream] = 0
                        if exactly_once and self.opts.append:
                            max_size[stream] = self._idmp_max_size(r, stream)
                    if not self.opts.append:
                        continue
                    fields: list[Any] = []
                    for name, values in payload:
                        value = values[i]
                        if value is not None:
                            fields += [name, value if isinstance(value, (bytes, str)) else str(value)]
                    if not fields:
                        fields = ["_empty", ""]
                    n = seen[stream]
                    seen[stream] = n + 1
                    if exactly_once:
                        size = max_size[stream]
                        pid = f"{self.run_tag}:{batch_id}:{partition}:{n // size}"
                        _cmd(pipe, "XADD", stream, "IDMP", pid, n % size, "*", *fields)
                    else:
                        _cmd(pipe, "XADD", stream, "*", *fields)
                    rows += 1
                    if len(pipe) >= FLUSH_ROWS:
                        pipe.execute()
                    if self.opts.fail_after_rows and first_attempt and rows == self.opts.fail_after_rows:
                        pipe.execute()
                        raise RuntimeError(f"injected failure after {rows} rows (option _failAfterRows)")
            if len(pipe):
                pipe.execute()
            return SinkCommit(rows=rows, streams=sorted(seen), exactly_once=exactly_once)
        finally:
            r.close()

    def _idmp_max_size(self, r: redis.Redis, stream: str) -> int:
        """The stream's IDMP max size (set first from the options when they differ)."""
        info: dict[Any, Any] = {}
        try:
            info = _cmd(r, "XINFO", "STREAM", stream)
        except redis.ResponseError:
            pass  # no such stream yet: the server's defaults apply
        if isinstance(info, list):
            info = dict(zip(info[::2], info[1::2]))
        current = {(k.decode() if isinstance(k, bytes) else k): v for k, v in info.items()}
        size = int(current.get("idmp-maxsize", 100) or 100)
        duration = int(current.get("idmp-duration", 100) or 100)
        want_size = self.opts.idmp_max_size or size
        want_duration = self.opts.idmp_duration or duration
        if (want_size, want_duration) != (size, duration) or (not current and (self.opts.idmp_max_size or
                                                                               self.opts.idmp_duration)):
            if not current:
                _cmd(r, "XADD", stream, "MAXLEN", "0", "*", "_init", "")  # XCFGSET needs the stream
            _cmd(r, "XCFGSET", stream, "IDMP-DURATION", want_duration, "IDMP-MAXSIZE", want_size)
        return max(1, min(want_size, 10_000))

    def register(self, messages: list[SinkCommit | None], batch_id: str, *, idmp: bool = True) -> None:
        """On the driver: register every data stream the job touched in the LBS, once."""
        if not self.opts.register:
            return
        streams = sorted({s for m in messages if m is not None for s in m.streams})
        if not streams:
            return
        from _lbscore import encode_input

        r = redis.Redis.from_url(self.opts.url)
        try:
            lbs_stream = _keys.input_stream(self.opts.service)
            exactly_once = idmp and self.opts.idmp and _server_version(r) >= IDMP_SERVER
            size = self._idmp_max_size(r, lbs_stream) if exactly_once else 0
            pipe = r.pipeline(transaction=False)
            for k, name in enumerate(streams):
                payload = encode_input(name, None)
                if exactly_once:
                    pid = f"{self.run_tag}:{batch_id}:register:{k // size}"
                    _cmd(pipe, "XADD", lbs_stream, "IDMP", pid, k % size, "*", _keys.INPUT_FIELD, payload)
                else:
                    _cmd(pipe, "XADD", lbs_stream, "*", _keys.INPUT_FIELD, payload)
                if len(pipe) >= FLUSH_ROWS:
                    pipe.execute()
            if len(pipe):
                pipe.execute()
        finally:
            r.close()


class LbsWriter(DataSourceArrowWriter):
    """Batch sink: Arrow batches in, pipelined XADD out, streams registered on commit."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        # Drawn here, on the driver, once per write job: every task retry shares it.
        self.core = _SinkCore(opts, schema, opts.run_tag or uuid.uuid4().hex)

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        return self.core.write_batches(iterator, "0")

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.core.register(_commits(messages), "0")


class LbsStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: the query's id is the run tag, each micro-batch's id is part of the producer ids."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.core = _SinkCore(opts, schema, opts.run_tag or "")

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        ctx = TaskContext.get()
        batch_id = (ctx.getLocalProperty("streaming.sql.batchId") if ctx else None) or "0"
        if not self.core.run_tag and ctx is not None:
            self.core.run_tag = ctx.getLocalProperty("sql.streaming.queryId") or "query"
        return self.core.write_batches(iterator, batch_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        # The driver-side commit cannot see the query's id: without a runTag
        # option, registration is at-least-once (a replayed batch registers again).
        self.core.register(_commits(messages), str(batchId), idmp=bool(self.core.opts.run_tag))


# ----------------------------------------------------------------- reader ---

def default_schema() -> StructType:
    """``stream string, id string, fields map<string, string>``: what a read gives without a schema."""
    return StructType([StructField("stream", StringType(), False), StructField("id", StringType(), False),
                       StructField("fields", MapType(StringType(), StringType()), True)])


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """One stream's entries from ``start`` to ``end`` (inclusive), fixed when the read was planned."""

    stream: str
    start: str
    end: str


_CASTS: dict[type, Any] = {LongType: int, IntegerType: int, DoubleType: float, FloatType: float,
                           BooleanType: lambda v: v.lower() in ("true", "1"), StringType: str}


def _cast(value: str | None, kind: DataType) -> Any:
    if value is None:
        return None
    try:
        return _CASTS.get(type(kind), str)(value)
    except ValueError:
        return None  # a field that is not a number where the schema says number: null


class LbsReader(DataSourceReader):
    """Batch reader: one partition per stream (or per ID range of a big one), ends fixed at planning."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        if not opts.get("url"):
            raise ConfigurationError("the lbs source needs option 'url'")
        self.url = opts["url"]
        self.schema = schema
        self.streams = [s.strip() for s in opts.get("streams", "").split(",") if s.strip()]
        self.pattern = opts.get("pattern")
        source = opts.get("source")
        if source is not None:
            service = opts.get("service")
            if not service:
                raise ConfigurationError("option 'source' needs option 'service'")
            if source.lower() == "lbs":
                self.streams.append(_keys.input_stream(service))
            elif source.lower() in ("dlq", "dead-letters"):
                self.streams.append(_keys.dead_letter_stream(service))
            else:
                raise ConfigurationError(f"option 'source' must be 'lbs' or 'dlq', got {source!r}")
        if not self.streams and not self.pattern:
            raise ConfigurationError("the lbs source needs option 'streams' (comma-separated), 'pattern', "
                                     "or 'source' ('lbs' or 'dlq') with 'service'")
        self.split_entries = int(opts.get("splitentries", "0") or 0)
        self.page = 1_000

    def partitions(self) -> list[StreamRange]:
        r: Any = redis.Redis.from_url(self.url)
        try:
            names = list(self.streams)
            if self.pattern:
                names += sorted(k.decode() for k in r.scan_iter(match=self.pattern, count=1000, _type="stream"))
            out: list[StreamRange] = []
            for name in dict.fromkeys(names):
                newest = r.xrevrange(name, "+", "-", count=1)
                if not newest:
                    continue  # no such stream, or empty: nothing to read
                end = newest[0][0].decode()
                if self.split_entries > 0 and r.xlen(name) > self.split_entries:
                    out += self._split(r, name, end)
                else:
                    out.append(StreamRange(name, "-", end))
            return out
        finally:
            r.close()

    def _split(self, r: Any, name: str, end: str) -> list[StreamRange]:
        """ID ranges of about ``splitEntries`` entries each (the driver reads the ids once)."""
        bounds, start = [], "-"
        while True:
            page = r.xrange(name, start, end, count=self.split_entries + 1)
            if len(page) <= self.split_entries:
                bounds.append((start, end))
                return [StreamRange(name, a, b) for a, b in bounds]
            last = page[self.split_entries - 1][0].decode()
            bounds.append((start, last))
            start = "(" + last

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, StreamRange)
        names = [f.name for f in self.schema.fields]
        kinds = {f.name: f.dataType for f in self.schema.fields}
        r: Any = redis.Redis.from_url(self.url)
        try:
            start = partition.start
            while True:
                page = r.xrange(partition.stream, start, partition.end, count=self.page)
                for raw_id, raw in page:
                    entry_id = raw_id.decode()
                    fields = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in raw.items()}
                    row: list[Any] = []
                    for n in names:
                        if n == "stream":
                            row.append(partition.stream)
                        elif n == "id":
                            row.append(entry_id)
                        elif n == "fields":
                            row.append(fields)
                        else:
                            row.append(_cast(fields.get(n), kinds[n]))
                    yield tuple(row)
                if len(page) < self.page:
                    return
                start = "(" + page[-1][0].decode()
        finally:
            r.close()


class LbsDataSource(DataSource):
    """The data source ``lbs``: ``spark.read.format("lbs")``, ``df.write.format("lbs")`` and
    ``df.writeStream.format("lbs")``."""

    @classmethod
    def name(cls) -> str:
        return "lbs"

    def schema(self) -> StructType:
        return default_schema()

    def reader(self, schema: StructType) -> LbsReader:
        return LbsReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ConfigurationError("the lbs sink is append-only: mode('overwrite') is not supported; "
                                     "use mode('append')")
        return LbsWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> LbsStreamWriter:  # noqa: N802 - Spark's name
        if overwrite:
            raise ConfigurationError("the lbs sink is append-only: outputMode('complete') is not supported")
        return LbsStreamWriter(SinkOptions.parse(self.options), schema)
