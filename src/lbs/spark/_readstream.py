"""The streaming reader: ``spark.readStream.format("lbs")``.

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

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from .._redis.connection import ensure_group_sync
from .._streamids import id_key
from ..exceptions import ConfigurationError
from ._options import number
from ._read import _FIRST, CONSUMER, PAGE, _Fetcher, _Options

__all__ = ["GroupRange", "LbsStreamReader"]


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
