"""The batch reader, ``spark.read.format("lbs")``, and what it shares with the streaming one.

Both read raw replies (no redis-py per-entry dicts) and hand Spark Arrow
record batches: ``stream``, ``id`` and the fields as a map, or the fields a
schema names as typed columns.

The batch reader plans one partition per stream (or per ID range of a big
one), each ending at the stream's newest id at planning time, so a retried
task reads the same rows.
The streaming reader is :mod:`lbs.spark._readstream`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import MapType, StringType, StructField, StructType

from .. import _keys
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
