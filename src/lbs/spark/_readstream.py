"""The streaming reader: ``spark.readStream.format("lbs")``.

The streaming reader keeps one consumer group per query (option ``group``)
with one consumer, ``spark``. Offsets are ``{stream: last id included}``. A
partition (:mod:`lbs.spark._plan`: many small streams, or one big one) reads
each of its streams from the start offset: first the consumer's own
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
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from .._redis.errors import BusyGroupError, NoGroupError, WrongTypeError, classify
from .._redis.wire import text
from .._streamids import id_key
from ..exceptions import ConfigurationError
from ._options import number
from ._plan import (
    DEFAULT_REFRESH_S,
    PEEK,
    Discovery,
    Ranges,
    chunks,
    lengths,
    moved,
    newest,
    node_name,
    pack,
)
from ._read import (
    _FIRST,
    CONSUMER,
    PAGE,
    _arrow_schema,
    _Fetcher,
    _Links,
    _Options,
    combined,
)

__all__ = ["LbsStreamReader"]

try:  # PySpark >= 4.2: Trigger.AvailableNow in as many batches as the read limit needs
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow as _AvailableNow
except ImportError:  # PySpark 4.0 and 4.1 run an availableNow query as one batch of everything

    class _AvailableNow:  # type: ignore[no-redef]
        pass


class LbsStreamReader(_Options, DataSourceStreamReader, _AvailableNow):
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
        refresh = number(opts, "patternRefreshSeconds", minimum=0)
        self._discovery = Discovery(
            self.sources.names, DEFAULT_REFRESH_S if refresh is None else refresh
        )
        self._client: Any = None  # the driver side's connection, opened on first use
        self._latest: dict[str, str] = {}
        #: Where the streams' round starts this trigger (a cap below the stream count moves on).
        self._turn = -1
        #: Each stream's length at the last trigger, and the entries its next range holds by estimate.
        self._lengths: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        #: The offsets acknowledged up to, per stream (a commit skips the streams that did not move).
        self._acked: dict[str, str] = {}
        #: An availableNow query's end: each stream's newest id when it started (None: no end).
        self._target: dict[str, str] | None = None

    def _redis(self) -> Any:
        if self._client is None:
            self._client = self.connection.client()
        return self._client

    def initialOffset(self) -> dict[str, str]:
        """Create the group on every stream (idempotent: Spark calls this twice) and start where it is:
        after the group's last delivered entry, or before the consumer's oldest pending one (a query
        that died in its first batch delivered entries it never committed: Spark asks again for the
        initial offset, and the batch run again must read them)."""
        r = self._redis()
        names = self._discovery.names(r)
        _ensure_groups(r, names, self.group, "0" if self.starting == "earliest" else "$")
        offsets = _delivered(r, names, self.group)
        self._latest = offsets
        return offsets

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to each stream's newest entry now (a fresh SCAN of the
        pattern), in as many batches as the read limit needs, then stop; a stream or an entry that
        comes later waits for the next run."""
        r = self._redis()
        names = self._discovery.names(r, fresh=True)
        self._target = {name: last for name, last, _ in newest(r, names, with_length=False)}

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
        names = self._discovery.names(r)
        found = [name for name in names if name not in start]
        if found:  # streams the pattern found since the query started: read them whole
            _ensure_groups(r, found, self.group, "0")
            start.update(dict.fromkeys(found, _FIRST))
        out = dict(start)
        target = self._target
        if target is not None:  # availableNow: only the streams short of their end
            names = [n for n in names if n in target and id_key(start[n]) < id_key(target[n])]
        seen = moved(r, {name: start[name] for name in names})
        if cap is None:
            self._sizes = {}
            for name, (count, last) in seen.items():
                if count < PEEK:  # all its new entries were in the look
                    out[name], self._sizes[name] = last, count
            more = [name for name, (count, _) in seen.items() if count >= PEEK]
            for name, last, length in newest(r, more):
                out[name] = last
                before = self._lengths.get(name)
                self._sizes[name] = length if before is None else max(PEEK, length - before)
                self._lengths[name] = length
        else:
            names = [name for name in names if name in seen]
            self._turn = (self._turn + 1) % max(1, len(names))
            turned = names[self._turn :] + names[: self._turn]
            ends, self._sizes = _capped(r, turned, start, cap, target or {})
            out.update(ends)
        if target is not None:
            out = {
                n: _earlier(last, _later(target.get(n, start[n]), start[n]))
                for n, last in out.items()
            }
        self._latest = out
        return out

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_entries) if self.max_entries else ReadAllAvailable()

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[Ranges]:
        """The streams that moved, packed into partitions of about ``maxEntriesPerPartition`` entries
        (sizes as the trigger estimated them; a batch replayed after a restart uses the streams'
        lengths, an upper bound)."""
        moved = [
            (name, first, last)
            for name, last in end.items()
            if last != (first := start.get(name, _FIRST)) and id_key(last) > id_key(first)
        ]
        sizes = dict(self._sizes)
        unknown = [name for name, _, _ in moved if name not in sizes]
        if unknown:
            sizes.update(lengths(self._redis(), unknown))
        r = self._redis()
        return pack(
            [(name, a, b, sizes.get(name, 1)) for name, a, b in moved],
            node_name(r),
            self.partition_entries,
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, Ranges):
            return
        yield from combined(self._read(partition))

    def _read(self, partition: Ranges) -> Iterator[Any]:
        from _lbscore import Shape

        links = _Links(self.connection.client())
        arrow_schema = _arrow_schema(self.schema)
        try:
            for stream, start, end in partition.ranges:
                fetcher = _Fetcher(links.to(stream), stream, self.schema, arrow_schema)
                columns = fetcher.columns
                columns.bound(end)
                # 1. This consumer's pending entries after start: a replayed or retried batch reads
                #    them again.
                # 2. New entries (">"), until one passes the end: those stay pending for the next
                #    batch.
                for after in (start, ">"):
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
                            stream,
                            after,
                        )
                        batch = fetcher.batch()
                        if batch is not None:
                            yield batch
                        if not seen:
                            break  # pending: no more; new: none yet (or trimmed away)
                        if after != ">":
                            after = columns.last_id.decode() if columns.last_id else after
            links.ok = True
        finally:
            links.close()

    def commit(self, end: dict[str, str]) -> None:
        """Acknowledge the consumer's pending entries up to ``end`` (what Spark has finished), for the
        streams that moved since the last commit, pipelined (XPENDING, then XACK). A stream deleted
        since, or its group, has nothing left to acknowledge."""
        r = self._redis()
        todo = [name for name, last in end.items() if self._acked.get(name) != last]
        while todo:
            again: list[str] = []
            for chunk in chunks(todo):
                pipe = r.pipeline(transaction=False)
                for name in chunk:
                    pipe.xpending_range(
                        name,
                        self.group,
                        min="-",
                        max=end[name],
                        count=ACK_PAGE,
                        consumername=CONSUMER,
                    )
                pendings = pipe.execute(raise_on_error=False)
                pipe = r.pipeline(transaction=False)
                for name, pending in zip(chunk, pendings):
                    if isinstance(pending, Exception):
                        _gone_or_raise(name, pending)
                        continue
                    if pending:
                        pipe.xack(name, self.group, *[p["message_id"] for p in pending])
                    if len(pending) == ACK_PAGE:
                        again.append(name)
                    else:
                        self._acked[name] = end[name]
                pipe.execute()
            todo = again

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


#: Pending entries a commit reads and acknowledges at most per stream and round.
ACK_PAGE = 10_000


def _gone_or_raise(name: str, error: Exception) -> None:
    """A stream or group that is gone has nothing to acknowledge; a key that is not a stream is the
    caller's error, and anything else is raised."""
    typed = classify(error)
    if isinstance(typed, NoGroupError):
        return
    if isinstance(typed, WrongTypeError):
        raise ConfigurationError(f"{name!r} is not a stream: {typed}") from typed
    raise typed


def _ensure_groups(r: Any, names: list[str], group: str, at: str) -> None:
    """The query's group on each stream, from id ``at`` (a stream that does not exist is made
    empty; a group that exists stays as it is), pipelined."""
    for chunk in chunks(names):
        pipe = r.pipeline(transaction=False)
        for name in chunk:
            pipe.xgroup_create(name, group, id=at, mkstream=True)
        for name, reply in zip(chunk, pipe.execute(raise_on_error=False)):
            if isinstance(reply, Exception) and not isinstance(classify(reply), BusyGroupError):
                _gone_or_raise(name, reply)


def _delivered(r: Any, names: list[str], group: str) -> dict[str, str]:
    """Where the query starts each stream: after its group's last delivered entry, or before the
    consumer's oldest pending one where that is earlier (pipelined XINFO GROUPS and XPENDING)."""
    out: dict[str, str] = {}
    for chunk in chunks(names):
        pipe = r.pipeline(transaction=False)
        for name in chunk:
            pipe.xinfo_groups(name)
            pipe.xpending_range(name, group, min="-", max="+", count=1, consumername=CONSUMER)
        replies = pipe.execute()
        for k, name in enumerate(chunk):
            groups, oldest = replies[2 * k], replies[2 * k + 1]
            last = _FIRST
            for g in groups:
                if text(g["name"]) == group:
                    last = text(g["last-delivered-id"])
            if oldest:
                before = _before(text(oldest[0]["message_id"]))
                if id_key(before) < id_key(last):
                    last = before
            out[name] = last
    return out


def _earlier(a: str, b: str) -> str:
    return a if id_key(a) <= id_key(b) else b


def _later(a: str, b: str) -> str:
    return a if id_key(a) >= id_key(b) else b


def _before(entry_id: str) -> str:
    """The greatest id below ``entry_id`` (an offset is the last id included)."""
    ms, seq = id_key(entry_id)
    if seq > 0:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{2**64 - 1}" if ms > 0 else _FIRST


def _capped(
    r: Any, names: list[str], start: Mapping[str, str], cap: int, until: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, int]]:
    """The end offsets of at most ``cap`` new entries in all, and how many each stream's range holds:
    an equal share per stream first (one pipelined XRANGE each; with more streams than ``cap``, one
    entry for each of the first ``cap`` streams that have one, in the order given, which the caller
    turns each trigger), then what the streams with less left over goes to those that had more, in
    order; none past its ``until`` id (an availableNow query's end), where it has one."""
    share = max(1, cap // max(1, len(names)))
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.xrange(name, "(" + start[name], until.get(name, "+"), count=share)
    out: dict[str, str] = {}
    sizes: dict[str, int] = {}
    left, full = cap, []
    for name, entries in zip(names, pipe.execute()):
        if not entries or left <= 0:
            continue
        entries = entries[:left]
        out[name] = entries[-1][0].decode()
        sizes[name] = len(entries)
        left -= len(entries)
        if len(entries) == share:
            full.append(name)
    for name in full:
        if left <= 0:
            break
        more = r.xrange(name, "(" + out[name], until.get(name, "+"), count=left)
        if more:
            out[name] = more[-1][0].decode()
            sizes[name] += len(more)
            left -= len(more)
    return out, sizes
