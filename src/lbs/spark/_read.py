"""The batch reader, ``spark.read.format("lbs")``, and what it shares with the streaming one.

Both read raw replies (no redis-py per-entry dicts) and hand Spark Arrow
record batches: ``stream``, ``id`` and the fields as a map, or the fields a
schema names as typed columns.

The batch reader plans partitions of many streams, or of one big stream, or
of an ID range of one (:mod:`lbs.spark._plan`), each range ending at its
stream's newest id at planning time, so a retried task reads the same rows.
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
from ._plan import DEFAULT_PARTITION_ENTRIES, Ranges, newest, node_name, pack

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


class _Links:
    """A task's connections, one per node it reads from; replies go straight into the core's buffers."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._raw: dict[str, RawConnection] = {}
        self.ok = False

    def to(self, stream: str) -> RawConnection:
        name, node = node_of(self.client, stream)
        raw = self._raw.get(name)
        if raw is None:
            raw = self._raw[name] = RawConnection(node)
        return raw

    def close(self) -> None:
        for raw in self._raw.values():
            raw.close(self.ok)
        self.client.close()


class _Fetcher:
    """One stream's reads on its node's connection, into the core's column buffers."""

    def __init__(
        self, raw: RawConnection, stream: str, schema: StructType, arrow_schema: Any
    ) -> None:
        from _lbscore import EntryColumns

        self.raw = raw
        self.columns = EntryColumns()
        self.stream = stream
        self.schema = schema
        self.arrow_schema = arrow_schema

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


def combined(batches: Iterator[Any], rows: int = PAGE) -> Iterator[Any]:
    """Record batches of at least ``rows`` rows (but the last) from smaller ones: a partition of many
    small streams hands Spark a few big batches, not one per stream."""
    import pyarrow as pa

    held: list[Any] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield _one(pa, held)
            held, count = [], 0
    if held:
        yield _one(pa, held)


def _one(pa: Any, batches: list[Any]) -> Any:
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


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
        self.partition_entries = (
            number(self.opts, "maxEntriesPerPartition") or DEFAULT_PARTITION_ENTRIES
        )
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
    """Batch reader: streams packed into partitions of about ``maxEntriesPerPartition`` entries (a big
    stream alone, or cut into ID ranges by ``splitEntries``), ends fixed at planning."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.split_entries = number(self.opts, "splitEntries") or 0

    def partitions(self) -> list[Ranges]:
        client: Any = self.connection.client()
        try:
            ranges: list[tuple[str, str, str, int]] = []
            for name, end, length in newest(client, self.sources.names(client)):
                if self.split_entries > 0 and length > self.split_entries:
                    ranges += self._split(client, name, end)
                else:
                    ranges.append((name, "-", end, length))
            target = self.partition_entries
            if self.split_entries > 0:  # asked for ranges of that size: partitions no bigger
                target = min(target, self.split_entries)
            return pack(ranges, node_name(client), target)
        finally:
            client.close()

    def _split(self, client: Any, name: str, end: str) -> list[tuple[str, str, str, int]]:
        """ID ranges of about ``splitEntries`` entries each (the driver reads the ids once)."""
        bounds, start = [], "-"
        while True:
            page = client.xrange(name, start, end, count=self.split_entries + 1)
            if len(page) <= self.split_entries:
                bounds.append((name, start, end, len(page)))
                return bounds
            last = page[self.split_entries - 1][0].decode()
            bounds.append((name, start, last, self.split_entries))
            start = "(" + last

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, Ranges):
            return  # no stream to read: Spark plans one empty InputPartition of its own
        yield from combined(self._read(partition))

    def _read(self, partition: Ranges) -> Iterator[Any]:
        from _lbscore import Shape

        links = _Links(self.connection.client())
        arrow_schema = _arrow_schema(self.schema)
        try:
            for stream, start, end in partition.ranges:
                fetcher = _Fetcher(links.to(stream), stream, self.schema, arrow_schema)
                while True:
                    seen = fetcher.fetch(Shape.ENTRIES, "XRANGE", stream, start, end, "COUNT", PAGE)
                    batch = fetcher.batch()
                    if batch is not None:
                        yield batch
                    if seen < PAGE or fetcher.columns.last_id is None:
                        break
                    start = "(" + fetcher.columns.last_id.decode()
            links.ok = True
        finally:
            links.close()
