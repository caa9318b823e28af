"""The sink: ``df.write.format("lbs")`` and ``df.writeStream.format("lbs")``.

Executors append rows with pipelined XADD, encoded by the core straight from
Arrow columns (``_lbscore.encode_xadds``); the driver's commit registers each
data stream the job touched in the service's LBS, once. On Redis >= 8.6
every row carries XADD IDMP ids derived from (run tag, batch, partition,
chunk) and its index in the chunk, so a retried task adds nothing twice.
A streaming query also keeps what each batch wrote and committed in Redis
(:mod:`lbs.spark._ledger`), so a batch Spark runs again after a restart, however
late, writes nothing twice.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from .. import _keys
from ..exceptions import ConfigurationError
from ._append import IDMP_MAX_SIZE, Appender
from ._ledger import Ledger
from ._options import Connection, flag, lowered, number, server_version

log = logging.getLogger("lbs.spark")

IDMP_SERVER = (8, 6)


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
    pause_at: str | None = None  # tests: "commit-start:<file>" / "commit-end:<file>", see _pause

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
            pause_at=opts.get("_pauseat") or None,
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


class _SinkCore:
    """The write path shared by the batch and the streaming writer."""

    def __init__(
        self, opts: SinkOptions, schema: StructType, run_tag: str, *, streaming: bool = False
    ) -> None:
        self.opts = opts
        self.run_tag = run_tag
        #: A streaming query's batches are recorded (:mod:`lbs.spark._ledger`); a batch job's are not.
        self.streaming = streaming
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
        appender: Appender | None = None
        ok = False
        try:
            exactly_once = self.opts.idmp and server_version(client) >= IDMP_SERVER
            if not exactly_once:
                log.warning(
                    "lbs sink: Redis without XADD IDMP (needs 8.6) or idmp=false: at-least-once; "
                    "a retried task appends its rows again"
                )
            ledger = self._ledger(batch_id)
            done = (
                ledger.written(client, partition) if ledger is not None and self.opts.append else 0
            )
            if done:
                log.info(
                    "lbs sink: batch %s partition %d: %d rows written by an earlier run of the batch "
                    "are skipped",
                    batch_id,
                    partition,
                    done,
                )
            appender = Appender(
                client,
                self.opts,
                f"{self.run_tag}:{batch_id}:{partition}:" if exactly_once else None,
                (ledger, partition) if ledger is not None else None,
            )
            touched: set[str] = set()
            rows = unnamed = seen = 0
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
                rows += appender.append(
                    streams,
                    self.payload_columns,
                    columns,
                    stop,
                    offset=seen,
                    skip=max(0, done - seen),
                )
                seen += len(streams)
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

    def _ledger(self, batch_id: str) -> Ledger | None:
        if not self.streaming or not self.run_tag:
            return None
        return Ledger(self.opts.service, self.run_tag, int(batch_id))

    def register(
        self, messages: list[SinkCommit | None], batch_id: str, *, idmp: bool = True
    ) -> None:
        """On the driver: register every data stream the job touched in the LBS, once (a streaming
        batch: once whatever the restarts, recorded with its registrations)."""
        skipped = sum(m.skipped for m in messages if m is not None)
        if skipped:
            log.warning(
                "lbs sink: %d rows had no data stream (null %r) and were not written",
                skipped,
                self.opts.stream_column,
            )
        streams = sorted({s for m in messages if m is not None for s in m.streams})
        if not self.opts.register:
            streams = []
        ledger = self._ledger(batch_id)
        if ledger is not None:
            self._commit(ledger, streams)
            return
        if not streams:
            return
        from _lbscore import encode_input

        client = self.opts.connection.client()
        appender: Appender | None = None
        ok = False
        try:
            lbs_stream = _keys.input_stream(self.opts.service)
            exactly_once = idmp and self.opts.idmp and server_version(client) >= IDMP_SERVER
            appender = Appender(
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

    def _commit(self, ledger: Ledger, streams: list[str]) -> None:
        from _lbscore import encode_input

        _pause(self.opts.pause_at, "commit-start", streams)
        client = self.opts.connection.client()
        try:
            if ledger.committed(client):
                log.info(
                    "lbs sink: batch %d of query %s was committed by an earlier run: nothing to register",
                    ledger.batch,
                    ledger.query,
                )
                return
            lbs_stream = _keys.input_stream(self.opts.service)
            ledger.commit(client, lbs_stream, [encode_input(n, None) for n in streams])
        finally:
            client.close()
        _pause(self.opts.pause_at, "commit-end", streams)


def _pause(pause_at: str | None, where: str, streams: list[str]) -> None:
    """Tests (option ``_pauseAt`` = ``<where>:<file>``): at ``where`` of a commit that registers
    something, create the file and stop there: the test kills the driver meanwhile. Fails the commit
    if nobody has after 2 minutes, or as soon as this process is orphaned (the driver died)."""
    if not pause_at or not streams or not pause_at.startswith(where + ":"):
        return
    with open(pause_at[len(where) + 1 :], "w") as f:
        f.write(str(os.getpid()))
    parent, deadline = os.getppid(), time.monotonic() + 120
    while time.monotonic() < deadline and os.getppid() == parent:
        time.sleep(0.05)
    raise RuntimeError(f"lbs sink: paused at {where} (option _pauseAt) and not killed")


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
        self.core = _SinkCore(opts, schema, opts.run_tag or "", streaming=True)

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
