"""A Pub/Sub subscription whose messages are read in bulk through the core's ``RespReader``.

redis-py's ``PubSub`` reads one message per call, each under its own
timeout, and wraps, routes and logs it: about 40 µs of the client a message.
Expiry events can come in bursts (many consumers' leases lapsing at once, or
beside a Go fleet its Go-style locks, one per held entry: a dead Go holder of
100,000 streams sends 100,000 ``expired`` events within a second or two, to
every listening client), and at that price the listener alone would keep a
client's core busy for seconds. Here
a subscription is one connection from the pool, opened by redis-py (TLS,
AUTH, the RESP2/RESP3 handshake), whose bytes are parsed by the core: a read
of up to 64 KiB yields every message in it as a list, for about 1 µs each.

The connection never goes back to the pool subscribed: :meth:`close`
disconnects it first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from _lbscore import NEED_MORE, CommandBatch, RespReader

from .._waits import within
from .errors import reply_error

__all__ = ["Subscription"]


class Subscription:
    """PSUBSCRIBE (or SSUBSCRIBE) on one connection of ``redis``'s pool; messages come back as lists
    of bytes (``[b"pmessage", pattern, channel, data]``, ``[b"smessage", channel, data]``, a PING's
    reply, ...)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._pool = redis.connection_pool
        self._conn: Any = None
        self._reader = RespReader(reply_error)
        # When a PING was last sent and anything last arrived (monotonic): see heard().
        self._pinged = self._heard = 0.0

    async def open(self, *patterns: str, command: str = "PSUBSCRIBE") -> None:
        """Connect and subscribe to ``patterns`` (``command``: ``PSUBSCRIBE``, or ``SSUBSCRIBE`` for
        shard channels); returns once the server confirmed every one."""
        conn = self._conn = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        if not conn.is_connected:
            await conn.connect()
        self._send(command, *patterns)
        confirmed, kind = 0, command.lower().encode()
        while confirmed < len(patterns):
            for message in await self.messages(None):
                if isinstance(message, list) and message and message[0] == kind:
                    confirmed += 1
                elif isinstance(message, Exception):
                    raise message
        self._pinged = self._heard = time.monotonic()

    async def heard(self, ping_every: float) -> list[Any]:
        """:meth:`messages`, waiting up to ``min(1, ping_every)`` seconds, on a link kept honest: a
        PING every ``ping_every`` seconds (about 1 µs of Redis), and ``ConnectionError`` when nothing,
        not even a PONG, arrived for twice that (the link is half-open)."""
        messages = await self.messages(min(1.0, ping_every))
        now = time.monotonic()
        if messages:
            self._heard = now  # anything arriving proves the link is alive
        if now - self._pinged >= ping_every:
            self.ping()
            self._pinged = now
        if now - self._heard > 2 * ping_every:
            raise ConnectionError("no PONG on the subscription: it is half-open")
        return messages

    def ping(self) -> None:
        """Send a PING; its reply comes back among the messages (the proof the link is alive)."""
        self._send("PING")

    def _send(self, *args: str) -> None:
        if self._conn is None:
            raise RedisConnectionError("the subscription is closed")
        b = CommandBatch()
        b.command(*args)
        self._conn._writer.write(b.getvalue())

    async def messages(self, timeout: float | None) -> list[Any]:
        """Every message that has arrived, waiting up to ``timeout`` seconds (``None``: no limit) for the
        first; [] when none came in time. Raises ``redis.exceptions.ConnectionError`` when the connection
        is closed."""
        conn, reader = self._conn, self._reader
        if conn is None:
            raise RedisConnectionError("the subscription is closed")
        out: list[Any] = []
        while (item := reader.gets()) is not NEED_MORE:
            out.append(item)
        if out:
            return out
        try:
            data = await within(conn._reader.read(65536), timeout)
        except asyncio.TimeoutError:
            return out
        except OSError as exc:
            raise RedisConnectionError(f"subscription lost: {exc}") from exc
        if not data:
            raise RedisConnectionError("the subscription's connection was closed by the server")
        reader.feed(data)
        while (item := reader.gets()) is not NEED_MORE:
            out.append(item)
        return out

    async def close(self) -> None:
        """Disconnect (a subscribed connection is of no use to anyone else) and give it back to the pool."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.disconnect()
            finally:
                await self._pool.release(conn)
