"""Batches the core encodes, sent over a connection that redis-py manages.

redis-py opens the connection (TLS, AUTH/ACL, the RESP2/RESP3 handshake,
reconnects); lbs writes a :class:`_lbscore.CommandBatch` to it in one write
and reads the replies back through the core's own ``RespReader``, which
returns server errors as values: one reply per command, an error only for
the command that failed, its class read from the table in
:mod:`lbs._redis.errors`. A command whose reply holds stream entries says so
(``CommandBatch.expect``) and its entries come back as ``Entry`` objects,
built straight from the bytes. Per batch that is one buffer and one reader
loop, instead of redis-py's per-command packing and parsing.

A connection the server closed while it sat idle (``CLIENT KILL``, a
restart, an idle timeout) is noticed before the next batch is written (its
stream is at EOF) and replaced, so nothing is sent on a dead socket. A batch
whose connection fails while it is in flight may or may not have run: the
caller decides whether sending it again is safe (``retry_safe``). A batch
whose replies do not arrive within :data:`REPLY_TIMEOUT` (a connection left
half-open by a partition or a NAT that forgot it, which TCP would only give
up on after many minutes) has its connection aborted and fails the same way,
so no activity waits on a dead socket longer than that.

A READONLY reply (a master demoted to a replica by a failover) also drops the
connection once the batch is read: the next batch opens a new one, which a
Sentinel's pool (``redis+sentinel://``) opens on the master the Sentinels name
now. The command ran nowhere; callers retry it as after a redirect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import BusyLoadingError, NoScriptError, ReadOnlyError
from redis.exceptions import ConnectionError as RedisConnectionError

from _lbscore import NEED_MORE, CommandBatch, EntryParser, RespReader, Shape

from ..exceptions import DataError
from .errors import reply_error

__all__ = ["Wire", "exec_replies", "fields_text", "first_error", "text"]

#: The first pause before a batch that met LOADING is sent again (seconds; doubling up to 1).
LOADING_PAUSE = 0.05
#: Longest wait for a batch's replies (seconds) before its connection is taken for dead. Far above
#: what any lbs batch takes (a batch over 100,000 keys, as a heartbeat was under the lock per entry:
#: about 0.1 s), so only a connection that delivers nothing (half-open, a server stopped for that
#: long) reaches it.
REPLY_TIMEOUT = 30.0


def _abort(writer: asyncio.StreamWriter, late: list[bool]) -> None:
    """The watchdog's end: no replies in time; close the transport at once (the pending read fails)."""
    late.append(True)
    writer.transport.abort()


def _closed_by_peer(conn: Any) -> bool:
    """Whether the server closed ``conn`` (EOF or a transport error seen by the event loop)."""
    stream, writer = conn._reader, conn._writer
    return bool(stream.at_eof() or stream.exception() is not None or writer.is_closing())


def text(v: Any, errors: str = "strict") -> str:
    """A reply value as text: bytes (or another bytes-like) decoded as UTF-8 (``errors`` as for ``bytes.decode``)."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors)
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v).decode("utf-8", errors)
    return str(v)


def sendable(value: str) -> str:
    """Free text for a command (a reason, a traceback, a journal field) as text UTF-8 can encode: each
    lone surrogate becomes its escape (``\\ud800``), so one odd character fails no batch that carries it."""
    if value.isascii():
        return value
    try:
        value.encode()
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode()
    return value


#: What the core raises for a value it cannot encode (a str UTF-8 cannot encode: a lone surrogate),
#: from a call's build, before anything was written: nothing was sent.
UNENCODABLE = (UnicodeError, DataError)


def unencodable(count: int, call: Callable[[CommandBatch, int], None]) -> dict[int, str]:
    """Which of ``count`` calls the core cannot encode, each built alone into a batch never sent:
    their positions, and why. A batched call that failed to encode asks this, sets those calls aside
    to fail alone, and sends the others: one bad entry never fails its neighbours."""
    out: dict[int, str] = {}
    for i in range(count):
        try:
            call(CommandBatch(), i)
        except UNENCODABLE as exc:
            out[i] = str(exc)
    return out


def fields_text(raw: Any) -> dict[str, str]:
    """An entry's fields (a RESP3 map or a RESP2 flat list) as text, invalid UTF-8 replaced."""
    items = raw.items() if isinstance(raw, Mapping) else zip(raw[::2], raw[1::2])
    return {text(k, "replace"): text(v, "replace") for k, v in items}


def first_error(replies: list[Any]) -> list[Any]:
    """``replies`` of a batch, or the first server error among them, raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def exec_replies(replies: list[Any]) -> list[Any]:
    """The queued commands' replies of a ``MULTI`` ... ``EXEC`` batch (``replies``: every command's,
    ``EXEC``'s last). A refused transaction (EXECABORT: the ACL, a command the server does not know)
    is raised, with its cause where a command was refused when queued: nothing of it ran. Errors of
    commands that ran stay in the list."""
    first_error(replies[:-1])  # refused when queued (NOPERM, ...): EXEC aborted, its cause
    done = replies[-1]
    if isinstance(done, Exception):
        raise done
    if not isinstance(done, list):
        raise TypeError(f"EXEC replied {done!r}, not the transaction's replies")
    return done


class Wire:
    """One connection from a client's pool for batches; serialised by a lock.

    A hot path's wire holds its connection between batches (``hold=True``);
    an occasional caller's gives it back to the pool after each batch, so it
    costs the server no connection while idle.

    ``scripts`` are the Lua sources a batch may call by SHA: after a
    NOSCRIPT (a restart, a failover) they are loaded and the batch is sent
    again, which is safe because a batch that got NOSCRIPT for every command
    ran none of them (one sent ``retry_safe`` is sent again after a NOSCRIPT
    among other replies too: it may run twice). A batch that got LOADING for every command (a restarted
    Redis loading its data set) ran none of them either: it is sent again,
    with a doubling pause up to a second, until Redis has loaded. A LOADING
    reply among others is a ``redis.exceptions.BusyLoadingError``, a
    ``ConnectionError`` for the callers' retry loops.

    With ``track_id`` the wire asks each connection it opens for its
    ``CLIENT ID`` (before any batch is written on it), kept in
    :attr:`client_id`: what ``CLIENT UNBLOCK`` needs to wake a batch that
    blocks (the reader's blocking XREADGROUP of the LBS).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        scripts: Sequence[str] = (),
        *,
        hold: bool = True,
        track_id: bool = False,
    ) -> None:
        self._pool = redis.connection_pool
        self._hold = hold
        self._track_id = track_id
        #: The CLIENT ID of the connection batches go out on (``track_id``), None before the first.
        self.client_id: int | None = None
        #: How many connections this wire opened: a caller that must do something once per
        #: connection (the reader floors the fencing counter) compares it with the count it saw.
        self.connects = 0
        self._redis = redis
        self._scripts = list(scripts)
        self._conn: Any = None
        self._reader: Any = None
        self._lock = asyncio.Lock()

    async def execute(
        self,
        build: Callable[[CommandBatch], None],
        parser: EntryParser | None = None,
        *,
        retry_safe: bool = False,
    ) -> list[Any]:
        """Encode with ``build(batch)``, send, and return one reply per command.

        Server errors come back as exception instances in the list;
        connection failures raise (and drop the connection). Replies the
        batch marked with ``expect`` have their entries parsed by ``parser``.
        With ``retry_safe`` (the batch may run twice: it only reads, or its
        commands check what they change), a batch whose connection failed is
        sent once more on a fresh connection before the failure is raised.
        """
        return await self.execute_chunks(
            1, lambda batch, _k: build(batch), parser, retry_safe=retry_safe
        )

    async def close(self) -> None:
        """Give the connection back to the pool."""
        conn, self._conn, self._reader = self._conn, None, None
        if conn is not None:
            await self._pool.release(conn)

    async def execute_chunks(
        self,
        count: int,
        build: Callable[[CommandBatch, int], None],
        parser: EntryParser | None = None,
        *,
        retry_safe: bool = False,
    ) -> list[Any]:
        """Like :meth:`execute` for a batch sent in ``count`` parts, ``build(batch, k)`` encoding part ``k``.

        Each part is written as soon as it is encoded, and the next one is
        encoded while Redis runs it, so client and server work side by side
        instead of one after the other. Replies come back in order, one per
        command, with :meth:`execute`'s error handling; after a NOSCRIPT the
        parts are encoded and sent again, so ``build`` must encode the same
        commands each time it is called.
        """
        if count <= 0:
            return []
        async with self._lock:
            try:
                try:
                    replies = await self._stream(count, build, parser)
                except RedisConnectionError:
                    if not retry_safe:
                        raise
                    replies = await self._stream(count, build, parser)  # on a fresh connection
                pause = LOADING_PAUSE
                while replies and all(isinstance(r, BusyLoadingError) for r in replies):
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 1.0)
                    replies = await self._stream(count, build, parser)
                noscript = [isinstance(r, NoScriptError) for r in replies]
                # All NOSCRIPT: nothing ran. Some: the others ran, so only a batch that may run twice.
                if replies and (all(noscript) or (retry_safe and any(noscript))):
                    await self.load_scripts()
                    replies = await self._stream(count, build, parser)
                if any(type(r) is ReadOnlyError for r in replies):
                    await self._drop()  # a replica now: reconnect (to the new master) next time
            finally:
                if not self._hold:
                    await self.close()
        return replies

    async def _drop(self) -> None:
        """Disconnect the wire's connection (kept, so the next batch connects it again)."""
        self._reader = None
        if self._conn is not None:
            await self._conn.disconnect()

    async def load_scripts(self) -> None:
        """Load the scripts (after a NOSCRIPT that :meth:`execute` could not retry on its own: a batch
        whose other commands ran)."""
        for source in self._scripts:
            await self._redis.script_load(source)

    async def _stream(
        self, count: int, build: Callable[[CommandBatch, int], None], parser: EntryParser | None
    ) -> list[Any]:
        batch = CommandBatch()
        build(batch, 0)
        if count == 1 and not len(batch):
            return []
        conn = self._conn
        if conn is None:
            conn = self._conn = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            if conn.is_connected and self._reader is not None and _closed_by_peer(conn):
                # The server hung up while the connection sat idle: nothing of
                # ours is in flight, so a fresh connection is safe for anything.
                self._reader = None
                await conn.disconnect()
            if not conn.is_connected or self._reader is None:
                self.client_id = None
                await conn.connect()
                self.connects += 1
                if self._track_id:
                    await conn.send_command("CLIENT", "ID")
                    self.client_id = int(await conn.read_response())
                self._reader = RespReader(reply_error)
            writer, stream = conn._writer, conn._reader
            # The watchdog: nothing written and answered within REPLY_TIMEOUT, the connection is aborted
            # (the pending write or read then fails).
            late: list[bool] = []
            watchdog = asyncio.get_running_loop().call_later(REPLY_TIMEOUT, _abort, writer, late)
            try:
                shapes: list[int] = []  # per reply, when some part expects entries
                n = 0
                for k in range(count):
                    if batch.expects_entries:
                        shapes += [Shape.ANY] * (n - len(shapes))
                        shapes += [batch.reply_shape(i) for i in range(len(batch))]
                    n += len(batch)
                    writer.write(batch.getvalue())
                    if k + 1 < count:
                        batch.clear()
                        build(batch, k + 1)  # while Redis runs part k
                    await writer.drain()
                reader = self._reader
                out: list[Any] = []
                while len(out) < n:
                    i = len(out)
                    if i < len(shapes) and shapes[i] != Shape.ANY:
                        reply = reader.gets_entries(parser, shapes[i])
                    else:
                        reply = reader.gets()
                    if reply is NEED_MORE:
                        data = await stream.read(65536)
                        if not data:
                            raise RedisConnectionError("connection closed by the server")
                        reader.feed(data)
                        continue
                    out.append(reply)
            except (OSError, RedisConnectionError) as exc:
                if late:
                    raise RedisConnectionError(
                        f"no reply within {REPLY_TIMEOUT:g}s: the connection was "
                        "dropped (half-open, or the server stopped)"
                    ) from exc
                raise
            finally:
                watchdog.cancel()
            return out
        except OSError as exc:
            self._reader = None
            await conn.disconnect()
            raise RedisConnectionError(f"batch failed: {exc}") from exc
        except BaseException:
            # I/O error or cancellation mid-batch: the connection's state is
            # unknown; drop it, the next batch reconnects.
            self._reader = None
            await conn.disconnect()
            raise
