"""Batches the core encodes, sent over a connection that redis-py manages.

redis-py opens the connection (TLS, AUTH/ACL, the RESP2/RESP3 handshake,
reconnects); lbs writes a :class:`_lbscore.CommandBatch` to it in one write
and reads the replies back through the core's own ``RespReader``, which
returns server errors as values: one reply per command, an error only for
the command that failed. A command whose reply holds stream entries says so
(``CommandBatch.expect``) and its entries come back as ``Entry`` objects,
built straight from the bytes. Per batch that is one buffer and one reader
loop, instead of redis-py's per-command packing and parsing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from _lbscore import NEED_MORE, CommandBatch, EntryParser, RespReader, Shape

__all__ = ["Wire"]


def _reply_error(message: str) -> ResponseError:
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message)
    return ResponseError(message)


class Wire:
    """One connection from a client's pool, held for batches; serialised by a lock.

    ``scripts`` are the Lua sources a batch may call by SHA: after a
    NOSCRIPT (a restart, a failover) they are loaded and the batch is sent
    again, which is safe because a batch that got NOSCRIPT for every command
    ran none of them.
    """

    def __init__(self, redis: aioredis.Redis, scripts: Sequence[str] = ()) -> None:
        self._pool = redis.connection_pool
        self._redis = redis
        self._scripts = list(scripts)
        self._conn: Any = None
        self._reader: Any = None
        self._lock = asyncio.Lock()

    async def execute(self, build: Callable[[CommandBatch], None], parser: EntryParser | None = None) -> list[Any]:
        """Encode with ``build(batch)``, send, and return one reply per command.

        Server errors come back as exception instances in the list;
        connection failures raise (and drop the connection). Replies the
        batch marked with ``expect`` have their entries parsed by ``parser``.
        """
        batch = CommandBatch()
        build(batch)
        if not len(batch):
            return []
        async with self._lock:
            replies = await self._roundtrip(batch, parser)
            if replies and all(isinstance(r, NoScriptError) for r in replies):
                for source in self._scripts:
                    await self._redis.script_load(source)
                replies = await self._roundtrip(batch, parser)
        return replies

    async def _roundtrip(self, batch: CommandBatch, parser: EntryParser | None) -> list[Any]:
        conn = self._conn
        if conn is None:
            conn = self._conn = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            if not conn.is_connected or self._reader is None:
                await conn.connect()
                self._reader = RespReader(_reply_error)
            writer, stream = conn._writer, conn._reader
            writer.write(batch.getvalue())
            await writer.drain()
            reader = self._reader
            n = len(batch)
            out: list[Any] = []
            shaped = parser is not None and batch.expects_entries
            while len(out) < n:
                if shaped:
                    shape = batch.reply_shape(len(out))
                    reply = reader.gets_entries(parser, shape) if shape != Shape.ANY else reader.gets()
                else:
                    reply = reader.gets()
                if reply is NEED_MORE:
                    data = await stream.read(65536)
                    if not data:
                        raise RedisConnectionError("connection closed by the server")
                    reader.feed(data)
                    continue
                out.append(reply)
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

    async def close(self) -> None:
        """Give the connection back to the pool."""
        conn, self._conn, self._reader = self._conn, None, None
        if conn is not None:
            await self._pool.release(conn)
