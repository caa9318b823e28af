"""The sink: ``df.write.format("lbs")`` and ``df.writeStream.format("lbs")``.

Executors append rows with pipelined XADD, encoded by the core straight from
Arrow columns (``_lbscore.encode_xadds``); the driver's commit registers each
data stream the job touched in the service's LBS, once. On Redis >= 8.6
every row carries XADD IDMP ids derived from (run tag, batch, partition,
chunk) and its index in the chunk, so a retried task adds nothing twice.
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
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType
from redis.cluster import RedisCluster

from .. import _keys
from .._redis.connection import redirected
from ..exceptions import ConfigurationError, RedisOperationError
from ._options import Connection, RawConnection, flag, lowered, node_of, number, server_version

log = logging.getLogger("lbs.spark")

#: Rows encoded per pipeline round: one buffer per node, sent while the previous round's replies come back.
FLUSH_ROWS = 2_000
IDMP_SERVER = (8, 6)
#: The server's defaults for a stream's IDMP settings (``stream-idmp-maxsize`` / ``-duration``).
IDMP_DEFAULT_SIZE, IDMP_DEFAULT_DURATION, IDMP_MAX_SIZE = 100, 100, 10_000


@dataclass(frozen=True)
class SinkOptions:
    connection: Connection
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
        opts = lowered(options)
        connection = Connection.parse(opts, "the lbs sink")
        if not opts.get("service"):
            raise ConfigurationError(
                "the lbs sink needs option 'service' (the LBS the data streams are registered in)"
            )
        _keys.validate_service(opts["service"])
        register_only = flag(opts, "registerOnly", False)
        size = number(opts, "idmpMaxSize")
        if size is not None and size > IDMP_MAX_SIZE:
            raise ConfigurationError(
                f"option 'idmpMaxSize' must be at most {IDMP_MAX_SIZE}, got {size}"
            )
        return cls(
            connection=connection,
            service=opts["service"],
            stream_column=opts.get("streamcolumn", "stream"),
            register=flag(opts, "register", True) or register_only,
            append=not register_only,
            run_tag=opts.get("runtag") or None,
            idmp=flag(opts, "idmp", True),
            idmp_max_size=size,
            idmp_duration=number(opts, "idmpDuration"),
            fail_after_rows=number(opts, "_failAfterRows"),
        )


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one partition wrote: rows appended and the data streams it touched."""

    rows: int = 0
    skipped: int = 0  # rows whose stream column was null
    streams: list[str] = field(default_factory=list)
    run_tag: str = ""  # the streaming query's id, which only executors can see


def _commits(messages: list[WriterCommitMessage | None]) -> list[SinkCommit | None]:
    return [m if isinstance(m, SinkCommit) else None for m in messages]


def _info_dict(reply: Any) -> dict[str, Any]:
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    if not isinstance(reply, dict):
        return {}
    return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in reply.items()}


class _NodePipe:
    """One node's XADDs: encoded rounds go out in one write, replies are read by the core.

    A round is sent while the previous one's replies are still on their way;
    ``drain`` reads them. Server errors come back as values, so every failed
    command is counted and the first ones kept for the report.
    """

    def __init__(self, client: redis.Redis) -> None:
        from _lbscore import CommandBatch

        self.raw = RawConnection(client)
        self.batch = CommandBatch(1 << 17)
        self.in_flight = 0
        self.errors: list[Exception] = []
        self.failed = 0

    def send(self) -> None:
        if len(self.batch):
            self.raw.send(self.batch.getvalue())
            self.in_flight += len(self.batch)
            self.batch.clear()

    def drain(self) -> None:
        from _lbscore import NEED_MORE

        while self.in_flight:
            reply = self.raw.reader.gets()
            if reply is NEED_MORE:
                self.raw.receive()
                continue
            self.in_flight -= 1
            if isinstance(reply, Exception):
                self.failed += 1
                if len(self.errors) < 3:
                    self.errors.append(reply)

    def close(self, ok: bool) -> None:
        self.raw.close(ok and not self.in_flight)


class _Appender:
    """XADDs to many streams: one :class:`_NodePipe` per node that owns one of them.

    Every stream gets an :class:`_lbscore.XaddRoute` on first sight: its
    node's batch and, with ``pid_head`` (``"<run tag>:<batch>:<part>:"``;
    None: no IDMP), its IDMP chunk size.
    """

    def __init__(self, client: Any, opts: SinkOptions, pid_head: str | None) -> None:
        self.client = client
        self.opts = opts
        self.pid_head = pid_head
        self.routes: dict[str, Any] = {}
        self.pipes: dict[str, _NodePipe] = {}

    def route(self, streams: set[str]) -> None:
        """Make routes for streams seen for the first time (their IDMP max size read in one round)."""
        from _lbscore import XaddRoute

        new = sorted(streams - self.routes.keys())
        if not new:
            return
        sizes = _idmp_sizes(self.client, new, self.opts) if self.pid_head is not None else {}
        for name in new:
            node, client = node_of(self.client, name)
            pipe = self.pipes.get(node)
            if pipe is None:
                pipe = self.pipes[node] = _NodePipe(client)
            self.routes[name] = XaddRoute(
                pipe.batch, name, sizes.get(name, 0), (self.pid_head or "").encode()
            )

    def append(
        self,
        streams: list[Any],
        names: list[str],
        columns: list[list[Any]],
        stop: int | None = None,
    ) -> int:
        """Encode and send ``streams[:stop]``'s rows in rounds (see ``encode_xadds``); returns the rows sent."""
        from _lbscore import encode_xadds

        names_seen = set(streams[:stop])
        names_seen.discard(None)
        self.route(names_seen)
        end = len(streams) if stop is None else stop
        rows = 0
        for start in range(0, end, FLUSH_ROWS):
            rows += encode_xadds(
                streams, names, columns, self.routes, start, min(start + FLUSH_ROWS, end)
            )
            self.round()
        return rows

    def round(self) -> None:
        """Send what was encoded; read the previous round's replies meanwhile."""
        for pipe in self.pipes.values():
            pipe.drain()
            pipe.send()
        self._check()

    def finish(self) -> None:
        for pipe in self.pipes.values():
            pipe.send()
            pipe.drain()
        self._check()

    def _check(self) -> None:
        failed = sum(p.failed for p in self.pipes.values())
        if not failed:
            return
        first = next(e for p in self.pipes.values() for e in p.errors)
        if isinstance(self.client, RedisCluster) and any(
            redirected(e) for p in self.pipes.values() for e in p.errors
        ):
            self.client.nodes_manager.initialize()  # the retried task routes by the new slot map
            raise RedisOperationError(
                "XADD (a slot moved during the write; Spark retries the task)", first
            )
        raise RedisOperationError(f"XADD ({failed} rows refused)", first)

    def close(self, ok: bool) -> None:
        for pipe in self.pipes.values():
            pipe.close(ok)


def _idmp_sizes(client: Any, streams: list[str], opts: SinkOptions) -> dict[str, int]:
    """Each stream's IDMP max size, after XCFGSET where the options ask for other settings.

    XCFGSET clears the ids a stream tracks, so it only runs when the settings
    differ: the first attempt sets them and a retry finds them in place.
    """
    pipe = client.pipeline(transaction=False)
    for name in streams:
        pipe.execute_command("XINFO", "STREAM", name)
    replies = pipe.execute(raise_on_error=False)
    sizes: dict[str, int] = {}
    for name, reply in zip(streams, replies):
        info = {} if isinstance(reply, Exception) else _info_dict(reply)
        size = int(info.get("idmp-maxsize") or IDMP_DEFAULT_SIZE)
        duration = int(info.get("idmp-duration") or IDMP_DEFAULT_DURATION)
        want = (opts.idmp_max_size or size, opts.idmp_duration or duration)
        if want != (size, duration) or (not info and (opts.idmp_max_size or opts.idmp_duration)):
            if not info:  # XCFGSET needs the stream: create it empty
                client.execute_command("XADD", name, "MAXLEN", "0", "*", "_init", "")
            # raw: redis-py's xcfgset refuses durations over 300 s that the server accepts
            client.execute_command(
                "XCFGSET", name, "IDMP-DURATION", want[1], "IDMP-MAXSIZE", want[0]
            )
        sizes[name] = max(1, min(want[0], IDMP_MAX_SIZE))
    return sizes


class _SinkCore:
    """The write path shared by the batch and the streaming writer."""

    def __init__(self, opts: SinkOptions, schema: StructType, run_tag: str) -> None:
        self.opts = opts
        self.run_tag = run_tag
        names = [f.name for f in schema.fields]
        if opts.stream_column not in names:
            raise ConfigurationError(
                f"the lbs sink needs a column {opts.stream_column!r} naming each row's data "
                f"stream (option streamColumn); the columns are {names}"
            )
        self.payload_columns = [n for n in names if n != opts.stream_column]

    def write_batches(self, batches: Iterator[Any], batch_id: str) -> SinkCommit:
        import pyarrow as pa

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        first_attempt = ctx is None or ctx.attemptNumber() == 0
        fail_at = self.opts.fail_after_rows if first_attempt else None
        client = self.opts.connection.client()
        appender: _Appender | None = None
        ok = False
        try:
            exactly_once = self.opts.idmp and server_version(client) >= IDMP_SERVER
            if not exactly_once:
                log.warning(
                    "lbs sink: Redis without XADD IDMP (needs 8.6) or idmp=false: at-least-once; "
                    "a retried task appends its rows again"
                )
            appender = _Appender(
                client,
                self.opts,
                f"{self.run_tag}:{batch_id}:{partition}:" if exactly_once else None,
            )
            touched: set[str] = set()
            rows = unnamed = 0
            for batch in batches:
                column = batch.column(self.opts.stream_column)
                if not pa.types.is_string(column.type) and not pa.types.is_large_string(
                    column.type
                ):
                    column = column.cast(pa.string())
                streams = column.to_pylist()
                unnamed += column.null_count
                touched.update(streams)
                if not self.opts.append:
                    continue
                columns = [batch.column(n).to_pylist() for n in self.payload_columns]
                stop = (
                    fail_at - rows
                    if fail_at is not None and fail_at - rows <= len(streams)
                    else None
                )
                rows += appender.append(streams, self.payload_columns, columns, stop)
                if stop is not None:
                    appender.finish()
                    raise RuntimeError(
                        f"injected failure after {rows} rows (option _failAfterRows)"
                    )
            appender.finish()
            touched.discard(None)
            if unnamed:
                log.warning(
                    "lbs sink: partition %d skipped %d rows whose %r column is null (no data stream)",
                    partition,
                    unnamed,
                    self.opts.stream_column,
                )
            ok = True
            return SinkCommit(
                rows=rows, skipped=unnamed, streams=sorted(touched), run_tag=self.run_tag
            )
        finally:
            if appender is not None:
                appender.close(ok)
            client.close()

    def register(
        self, messages: list[SinkCommit | None], batch_id: str, *, idmp: bool = True
    ) -> None:
        """On the driver: register every data stream the job touched in the LBS, once."""
        skipped = sum(m.skipped for m in messages if m is not None)
        if skipped:
            log.warning(
                "lbs sink: %d rows had no data stream (null %r) and were not written",
                skipped,
                self.opts.stream_column,
            )
        if not self.opts.register:
            return
        streams = sorted({s for m in messages if m is not None for s in m.streams})
        if not streams:
            return
        from _lbscore import encode_input

        client = self.opts.connection.client()
        appender: _Appender | None = None
        ok = False
        try:
            lbs_stream = _keys.input_stream(self.opts.service)
            exactly_once = idmp and self.opts.idmp and server_version(client) >= IDMP_SERVER
            appender = _Appender(
                client, self.opts, f"{self.run_tag}:{batch_id}:register:" if exactly_once else None
            )
            appender.append(
                [lbs_stream] * len(streams),
                [_keys.INPUT_FIELD],
                [[encode_input(n, None) for n in streams]],
            )
            appender.finish()
            ok = True
        finally:
            if appender is not None:
                appender.close(ok)
            client.close()


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

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The driver side cannot see the query's id; the executors report it.
        commits = _commits(messages)
        if not self.core.run_tag:
            self.core.run_tag = next(
                (m.run_tag for m in commits if m is not None and m.run_tag), ""
            )
        self.core.register(commits, str(batchId), idmp=bool(self.core.run_tag))
