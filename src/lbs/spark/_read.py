"""The readers: ``spark.read.format("lbs")`` (batch) and ``spark.readStream.format("lbs")`` (streaming).

Both read raw replies (no redis-py per-entry dicts) and hand Spark Arrow
record batches: ``stream``, ``id`` and the fields as a map, or the fields a
schema names as typed columns.

The batch reader plans one partition per stream (or per ID range of a big
one), each ending at the stream's newest id at planning time, so a retried
task reads the same rows.

The streaming reader keeps one consumer group per query (option ``group``)
with one consumer, ``spark``. Offsets are ``{stream: last id included}``. A
partition reads its stream from the start offset: first the consumer's own
pending entries after it (``XREADGROUP ... <start>``: what a replayed batch
needs), then new ones (``>``) until it passes the end offset; entries read
past the end stay pending and the next batch reads them in its first pass.
``commit(end)`` acknowledges what the batch covered (XPENDING for the
consumer up to the end, then XACK). Spark calls it when it plans the next
batch, so acknowledgement lags one batch; the checkpoint, not the group,
decides where a restarted query resumes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import MapType, StringType, StructField, StructType

from .. import _keys
from .._redis.connection import ensure_group_sync
from .._streamids import id_key
from ..exceptions import ConfigurationError
from ._options import Connection, RawConnection, lowered, node_of, number

#: Entries per XRANGE / XREADGROUP page.
PAGE = 2_000
#: The streaming reader's one consumer in its group.
CONSUMER = "spark"
_FIRST = "0-0"


def default_schema() -> StructType:
    """``stream string, id string, fields map<string, string>``: what a read gives without a schema."""
    return StructType(
        [
            StructField("stream", StringType(), False),
            StructField("id", StringType(), False),
            StructField("fields", MapType(StringType(), StringType()), True),
        ]
    )


@dataclass(frozen=True)
class StreamRange(InputPartition):
    """One stream's entries after ``start`` up to ``end`` (inclusive), fixed when the read was planned.

    ``start`` is an XRANGE bound (``-``, ``<id>`` or ``(<id>`` for exclusive).
    """

    stream: str
    start: str
    end: str


@dataclass(frozen=True)
class Sources:
    """Which streams a read covers: a list, a SCAN pattern, the service's LBS or dead-letter stream."""

    streams: tuple[str, ...]
    pattern: str | None

    @classmethod
    def parse(cls, opts: Mapping[str, str]) -> Sources:
        streams = [s.strip() for s in opts.get("streams", "").split(",") if s.strip()]
        source = opts.get("source")
        if source is not None:
            service = opts.get("service")
            if not service:
                raise ConfigurationError("option 'source' needs option 'service'")
            _keys.validate_service(service)
            if source.lower() == "lbs":
                streams.append(_keys.input_stream(service))
            elif source.lower() in ("dlq", "dead-letters"):
                streams.append(_keys.dead_letter_stream(service))
            else:
                raise ConfigurationError(f"option 'source' must be 'lbs' or 'dlq', got {source!r}")
        pattern = opts.get("pattern") or None
        if not streams and not pattern:
            raise ConfigurationError(
                "the lbs source needs option 'streams' (comma-separated), 'pattern', "
                "or 'source' ('lbs' or 'dlq') with 'service'"
            )
        return cls(tuple(dict.fromkeys(streams)), pattern)

    def names(self, client: Any) -> list[str]:
        names = list(self.streams)
        if self.pattern:
            found = client.scan_iter(match=self.pattern, count=1000, _type="stream")
            names += sorted({k.decode() if isinstance(k, bytes) else k for k in found} - set(names))
        return names


# --------------------------------------------------------------- raw replies ---


class _Fetcher:
    """A connection to the node owning one stream; replies go straight into the core's column buffers."""

    def __init__(self, client: Any, stream: str, schema: StructType) -> None:
        from _lbscore import EntryColumns

        self.raw = RawConnection(node_of(client, stream)[1])
        self.columns = EntryColumns()
        self.stream = stream
        self.schema = schema
        self.arrow_schema = _arrow_schema(schema)
        self.ok = False

    def fetch(self, shape: int, *args: Any) -> int:
        """Send one command; its reply's entries join the columns. Returns the entries it held."""
        from _lbscore import NEED_MORE

        self.raw.send_command(*args)
        while True:
            seen = self.columns.read(self.raw.reader, shape)
            if seen is not NEED_MORE:
                assert isinstance(seen, int)
                return seen
            self.raw.receive()

    def batch(self) -> Any:
        """The entries fetched since the last batch, as an Arrow record batch (None if there are none)."""
        if not len(self.columns):
            return None
        return _arrow(self.schema, self.arrow_schema, self.stream, self.columns.take())

    def close(self) -> None:
        self.raw.close(self.ok)


def _strings(count: int, offsets: bytes, data: bytes) -> Any:
    """A string array over the core's buffers (validated: bytes that are not UTF-8 are replaced)."""
    import pyarrow as pa

    arr = pa.Array.from_buffers(
        pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        raw = pa.Array.from_buffers(
            pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        arr = pa.array([v.decode("utf-8", "replace") for v in raw.to_pylist()], pa.string())
    return arr


def _arrow(schema: StructType, arrow_schema: Any, stream: str, taken: tuple[Any, ...]) -> Any:
    """A record batch in ``schema``'s columns from ``EntryColumns.take()``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows, pairs, ids, id_off, keys, key_off, values, value_off, map_off = taken
    fields = pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), rows + 1, [None, pa.py_buffer(map_off)]),
        _strings(pairs, key_off, keys),
        _strings(pairs, value_off, values),
    )
    arrays = []
    for f in schema.fields:
        if f.name == "stream":
            arrays.append(pa.array([stream] * rows, pa.string()))
        elif f.name == "id":
            arrays.append(_strings(rows, id_off, ids))
        elif f.name == "fields" and isinstance(f.dataType, MapType):
            arrays.append(fields)
        else:
            arrays.append(_typed(pc.map_lookup(fields, pa.scalar(f.name), "first"), f))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _arrow_schema(schema: StructType) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema)


def _typed(strings: Any, f: StructField) -> Any:
    """Cast a string column to the schema's type; a value that does not parse becomes null."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.pandas.types import to_arrow_type

    target = to_arrow_type(f.dataType)
    if target == pa.string():
        return strings
    if pa.types.is_boolean(target):
        lowered_values = pc.utf8_lower(strings)
        return pc.if_else(
            pc.is_in(lowered_values, pa.array(["true", "1"])),
            True,
            pc.if_else(pc.is_null(strings), pa.scalar(None, pa.bool_()), False),
        )
    try:
        return strings.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        out = []
        for v in strings.to_pylist():
            try:
                out.append(None if v is None else pa.scalar(v).cast(target).as_py())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                out.append(None)
        return pa.array(out, target)


class _Options:
    """What both readers take from their options: the connection, the sources, the schema."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.opts = lowered(options)
        self.connection = Connection.parse(self.opts)
        self.sources = Sources.parse(self.opts)
        _check_schema(schema)
        self.schema = schema


def _check_schema(schema: StructType) -> None:
    for f in schema.fields:
        if f.name == "fields" and not (
            isinstance(f.dataType, MapType)
            and isinstance(f.dataType.keyType, StringType)
            and isinstance(f.dataType.valueType, StringType)
        ):
            raise ConfigurationError(
                "column 'fields' must be map<string, string> (an entry's fields)"
            )
        if f.name in ("stream", "id") and not isinstance(f.dataType, StringType):
            raise ConfigurationError(f"column {f.name!r} must be a string")


# --------------------------------------------------------------------- batch ---


class LbsReader(_Options, DataSourceReader):
    """Batch reader: one partition per stream (or per ID range of a big one), ends fixed at planning."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.split_entries = number(self.opts, "splitEntries") or 0

    def partitions(self) -> list[StreamRange]:
        client: Any = self.connection.client()
        try:
            out: list[StreamRange] = []
            for name in self.sources.names(client):
                newest = client.xrevrange(name, "+", "-", count=1)
                if not newest:
                    continue  # no such stream, or empty: nothing to read
                end = newest[0][0].decode()
                if self.split_entries > 0 and client.xlen(name) > self.split_entries:
                    out += self._split(client, name, end)
                else:
                    out.append(StreamRange(name, "-", end))
            return out
        finally:
            client.close()

    def _split(self, client: Any, name: str, end: str) -> list[StreamRange]:
        """ID ranges of about ``splitEntries`` entries each (the driver reads the ids once)."""
        bounds, start = [], "-"
        while True:
            page = client.xrange(name, start, end, count=self.split_entries + 1)
            if len(page) <= self.split_entries:
                bounds.append((start, end))
                return [StreamRange(name, a, b) for a, b in bounds]
            last = page[self.split_entries - 1][0].decode()
            bounds.append((start, last))
            start = "(" + last

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from _lbscore import Shape

        if not isinstance(partition, StreamRange):
            return  # no stream to read: Spark plans one empty InputPartition of its own
        client = self.connection.client()
        fetcher = _Fetcher(client, partition.stream, self.schema)
        try:
            start = partition.start
            while True:
                seen = fetcher.fetch(
                    Shape.ENTRIES, "XRANGE", partition.stream, start, partition.end, "COUNT", PAGE
                )
                batch = fetcher.batch()
                if batch is not None:
                    yield batch
                if seen < PAGE or fetcher.columns.last_id is None:
                    break
                start = "(" + fetcher.columns.last_id.decode()
            fetcher.ok = True
        finally:
            fetcher.close()
            client.close()


# ----------------------------------------------------------------- streaming ---


@dataclass(frozen=True)
class GroupRange(InputPartition):
    """One stream's entries after ``start`` up to ``end`` (ids), read through the query's group."""

    stream: str
    start: str
    end: str


class LbsStreamReader(_Options, DataSourceStreamReader):
    """Streaming reader: offsets are ``{stream: last id included}``, one consumer group per query."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        opts = self.opts
        group = opts.get("group")
        if not group:
            raise ConfigurationError(
                "readStream of the lbs source needs option 'group': a consumer group of "
                "its own per query (its pending entries are what a restart replays)"
            )
        self.group = group
        starting = (opts.get("startingoffsets") or "earliest").lower()
        if starting not in ("earliest", "latest"):
            raise ConfigurationError(
                f"option 'startingOffsets' must be 'earliest' or 'latest', got {starting!r}"
            )
        self.starting = starting
        self.max_entries = number(opts, "maxEntriesPerTrigger")
        self._client: Any = None  # the driver side's connection, opened on first use
        self._latest: dict[str, str] = {}
        #: Where the streams' round starts this trigger (a cap below the stream count moves on).
        self._turn = -1

    def _redis(self) -> Any:
        if self._client is None:
            self._client = self.connection.client()
        return self._client

    def _delivered(self, name: str) -> str:
        """Where the query starts reading ``name``: after the group's last delivered entry, or before
        the consumer's oldest pending one (a query that died in its first batch delivered entries it
        never committed: Spark asks again for the initial offset, and the batch run again must read
        them)."""
        r = self._redis()
        last = _FIRST
        for g in r.xinfo_groups(name):
            group_name = g["name"].decode() if isinstance(g["name"], bytes) else g["name"]
            if group_name == self.group:
                raw = g["last-delivered-id"]
                last = raw.decode() if isinstance(raw, bytes) else str(raw)
        oldest = r.xpending_range(
            name, self.group, min="-", max="+", count=1, consumername=CONSUMER
        )
        if oldest:
            first = oldest[0]["message_id"]
            before = _before(first.decode() if isinstance(first, bytes) else str(first))
            if id_key(before) < id_key(last):
                return before
        return last

    def initialOffset(self) -> dict[str, str]:
        """Create the group on every stream (idempotent: Spark calls this twice) and start where it is."""
        offsets = {}
        for name in self.sources.names(self._redis()):
            ensure_group_sync(
                self._redis(), name, self.group, at="0" if self.starting == "earliest" else "$"
            )
            offsets[name] = self._delivered(name)
        self._latest = offsets
        return offsets

    def latestOffset(
        self, start: dict[str, str] | None = None, limit: Any = None
    ) -> dict[str, str]:
        """Each stream's newest id, or, capped by ``maxEntriesPerTrigger`` or Spark's read limit (a
        total over the streams), the ids that take that many entries in all (:func:`_capped`)."""
        r = self._redis()
        # Spark < 4.2 calls latestOffset() without the start: this run's previous answer is it.
        start = dict(start if start is not None else self._latest)
        cap = self.max_entries
        max_rows = getattr(limit, "maxRows", None)
        if limit is not None and type(limit).__name__ == "ReadAllAvailable":
            cap = None
        elif max_rows is not None:
            cap = int(max_rows)
        names = self.sources.names(r)
        for name in names:
            if (
                name not in start
            ):  # a stream the pattern found since the query started: read it whole
                ensure_group_sync(r, name, self.group)
                start[name] = _FIRST
        out = dict(start)
        if cap is None:
            pipe = r.pipeline(transaction=False)
            for name in names:
                pipe.xrevrange(name, "+", "-", count=1)
            for name, newest in zip(names, pipe.execute()):
                if newest:
                    out[name] = newest[-1][0].decode()
        else:
            self._turn = (self._turn + 1) % max(1, len(names))
            out.update(_capped(r, names[self._turn :] + names[: self._turn], start, cap))
        self._latest = out
        return out

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_entries) if self.max_entries else ReadAllAvailable()

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[GroupRange]:
        return [
            GroupRange(name, start.get(name, _FIRST), last)
            for name, last in end.items()
            if id_key(last) > id_key(start.get(name, _FIRST))
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from _lbscore import Shape

        if not isinstance(partition, GroupRange):
            return
        client = self.connection.client()
        fetcher = _Fetcher(client, partition.stream, self.schema)
        columns = fetcher.columns
        columns.bound(partition.end)
        try:
            # 1. This consumer's pending entries after start: a replayed or retried batch reads them again.
            # 2. New entries (">"), until one passes the end: those stay pending for the next batch.
            for after in (partition.start, ">"):
                while not columns.passed:
                    seen = fetcher.fetch(
                        Shape.XREAD,
                        "XREADGROUP",
                        "GROUP",
                        self.group,
                        CONSUMER,
                        "COUNT",
                        PAGE,
                        "STREAMS",
                        partition.stream,
                        after,
                    )
                    batch = fetcher.batch()
                    if batch is not None:
                        yield batch
                    if not seen:
                        break  # pending: no more; new: none yet (or trimmed away)
                    if after != ">":
                        after = columns.last_id.decode() if columns.last_id else after
            fetcher.ok = True
        finally:
            fetcher.close()
            client.close()

    def commit(self, end: dict[str, str]) -> None:
        """Acknowledge the consumer's pending entries up to ``end`` (what Spark has finished)."""
        r = self._redis()
        for name, last in end.items():
            while True:
                pending = r.xpending_range(
                    name, self.group, min="-", max=last, count=10_000, consumername=CONSUMER
                )
                if not pending:
                    break
                r.xack(name, self.group, *[p["message_id"] for p in pending])
                if len(pending) < 10_000:
                    break

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _before(entry_id: str) -> str:
    """The greatest id below ``entry_id`` (an offset is the last id included)."""
    ms, seq = id_key(entry_id)
    if seq > 0:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{2**64 - 1}" if ms > 0 else _FIRST


def _capped(r: Any, names: list[str], start: Mapping[str, str], cap: int) -> dict[str, str]:
    """The end offsets of at most ``cap`` new entries in all: an equal share per stream first (one
    pipelined XRANGE each; with more streams than ``cap``, one entry for each of the first ``cap``
    streams that have one, in the order given, which the caller turns each trigger), then what the
    streams with less left over goes to those that had more, in order."""
    share = max(1, cap // max(1, len(names)))
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.xrange(name, "(" + start[name], "+", count=share)
    out: dict[str, str] = {}
    left, full = cap, []
    for name, entries in zip(names, pipe.execute()):
        if not entries or left <= 0:
            continue
        entries = entries[:left]
        out[name] = entries[-1][0].decode()
        left -= len(entries)
        if len(entries) == share:
            full.append(name)
    for name in full:
        if left <= 0:
            break
        more = r.xrange(name, "(" + out[name], "+", count=left)
        if more:
            out[name] = more[-1][0].decode()
            left -= len(more)
    return out
