"""The sink's writes: XADDs to many streams, one raw pipe per node that owns one of them.

Rows are encoded by the core (``_lbscore.encode_xadds``) into one buffer per node, each round sent
while the previous round's replies come back; every stream's IDMP chunk size is read (and set, with
the sink's ``idmpMaxSize`` / ``idmpDuration``) on first sight; a streaming batch's partition records
in its :class:`~lbs.spark._ledger.Ledger` how many of its rows Redis acknowledged, round by round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis
from redis.cluster import RedisCluster

from .._redis.connection import redirected
from ..exceptions import RedisOperationError
from ._ledger import Ledger
from ._options import RawConnection, node_of

if TYPE_CHECKING:
    from ._sink import SinkOptions

__all__ = ["FLUSH_ROWS", "IDMP_MAX_SIZE", "Appender"]

#: Rows encoded per pipeline round: one buffer per node, sent while the previous round's replies come back.
FLUSH_ROWS = 2_000
#: The server's defaults for a stream's IDMP settings (``stream-idmp-maxsize`` / ``-duration``).
IDMP_DEFAULT_SIZE, IDMP_DEFAULT_DURATION, IDMP_MAX_SIZE = 100, 100, 10_000


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


class Appender:
    """XADDs to many streams: one :class:`_NodePipe` per node that owns one of them.

    Every stream gets an :class:`_lbscore.XaddRoute` on first sight: its
    node's batch and, with ``pid_head`` (``"<run tag>:<batch>:<part>:"``;
    None: no IDMP), its IDMP chunk size.
    """

    def __init__(
        self,
        client: Any,
        opts: SinkOptions,
        pid_head: str | None,
        ledger: tuple[Ledger, int] | None = None,
    ) -> None:
        self.client = client
        self.opts = opts
        self.pid_head = pid_head
        self.routes: dict[str, Any] = {}
        self.pipes: dict[str, _NodePipe] = {}
        #: The streaming batch's record and this task's partition (None: nothing recorded).
        self.ledger = ledger
        #: Rows of the partition (from its first) sent in the round in flight, and acknowledged.
        self._sent = self._acked = 0

    def pipe_for(self, key: str) -> _NodePipe:
        """The pipe of the node that owns ``key``."""
        node, client = node_of(self.client, key)
        pipe = self.pipes.get(node)
        if pipe is None:
            pipe = self.pipes[node] = _NodePipe(client)
        return pipe

    def route(self, streams: set[str]) -> None:
        """Make routes for streams seen for the first time (their IDMP max size read in one round)."""
        from _lbscore import XaddRoute

        new = sorted(streams - self.routes.keys())
        if not new:
            return
        sizes = _idmp_sizes(self.client, new, self.opts) if self.pid_head is not None else {}
        for name in new:
            pipe = self.pipe_for(name)
            self.routes[name] = XaddRoute(
                pipe.batch, name, sizes.get(name, 0), (self.pid_head or "").encode()
            )

    def append(
        self,
        streams: list[Any],
        names: list[str],
        columns: list[list[Any]],
        stop: int | None = None,
        *,
        offset: int = 0,
        skip: int = 0,
    ) -> int:
        """Encode and send ``streams[:stop]``'s rows in rounds (see ``encode_xadds``); returns the rows
        sent. ``offset``: the partition's rows before these; the first ``skip`` of these are encoded
        and dropped unsent (an earlier run of the batch wrote them: their IDMP ids are used up)."""
        from _lbscore import encode_xadds

        names_seen = set(streams[:stop])
        names_seen.discard(None)
        self.route(names_seen)
        end = len(streams) if stop is None else stop
        rows = 0
        for start in range(0, end, FLUSH_ROWS):
            last = min(start + FLUSH_ROWS, end)
            if start < skip:
                encode_xadds(streams, names, columns, self.routes, start, min(skip, last))
                for pipe in self.pipes.values():
                    pipe.batch.clear()
                start = min(skip, last)
                if start == last:
                    continue
            rows += encode_xadds(streams, names, columns, self.routes, start, last)
            self.round(offset + last)
        return rows

    def round(self, upto: int) -> None:
        """Send what was encoded (the partition's rows up to ``upto``); read the previous round's
        replies meanwhile, and record them acknowledged with this round."""
        for pipe in self.pipes.values():
            pipe.drain()
        self._check()
        self._mark(self._sent)
        self._sent = upto
        for pipe in self.pipes.values():
            pipe.send()

    def finish(self) -> None:
        for pipe in self.pipes.values():
            pipe.send()
            pipe.drain()
        self._check()
        if self._mark(self._sent):
            self.finish()

    def _mark(self, acked: int) -> bool:
        """Queue the record that the partition's rows up to ``acked`` are written (when it grew)."""
        if self.ledger is None or acked <= self._acked:
            return False
        ledger, partition = self.ledger
        ledger.mark(self.pipe_for(ledger.batch_key()).batch, partition, acked)
        self._acked = acked
        return True

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
