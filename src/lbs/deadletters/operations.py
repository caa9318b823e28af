"""The operator's side of dead letters (``lbs dlq``): :class:`DeadLetters` lists, shows, counts,
replays and purges the letters still in a service's dead-letter stream."""

from __future__ import annotations

from collections.abc import Iterable

from .._admin import time_ms
from .._redis.connection import execute
from .._streamids import id_key
from ..exceptions import ConfigurationError, RedisOperationError
from ._stream import PAGE, LetterStream, id_rows
from .letters import DeadLetter
from .replay import Replay, replay

__all__ = ["DeadLetters"]

# Aliases for annotations inside DeadLetters, whose method ``list`` hides the builtin there.
_Letters = list[DeadLetter]
_Replays = list[Replay]


class DeadLetters(LetterStream):
    """The dead letters of one service still in its dead-letter stream: list, show, replay, purge.

    ::

        async with DeadLetters("redis://...", "orders") as dlq:
            for letter in await dlq.list(10, reason="timeout"):
                print(letter.id, letter.reason)
            done = await dlq.replay(reason="timeout")

    ``redis`` is a redis.asyncio client (left open), a ``RedisCluster``
    (or ``cluster=True``) or a URL (opened here, closed by :meth:`aclose`).
    ``config`` gives the managed-field prefix, the dead-letter stream
    (``Config.dead_letter_stream``) and the size limit a replayed
    ``lbs-input`` is judged by (``Config.max_input_bytes``). Which letters:
    explicit ``ids``; or ``reason`` (a case-insensitive substring of their
    reason); or ``all=True``; ``ids`` with ``reason`` takes the ids whose
    reason matches. ``until`` (an id) leaves out letters written after it,
    so a count shown for confirmation is what is acted on.

    Redis failures, and keys of the wrong type (the message names the key),
    raise :class:`lbs.RedisOperationError`; bad arguments
    :class:`lbs.ConfigurationError`.
    """

    async def __aenter__(self) -> DeadLetters:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def count(self) -> int:
        """How many letters the dead-letter stream holds."""
        async with self._redis("count") as r:
            await self._check_types(r, "count")
            return int(await r.xlen(self.key))

    async def server_time_ms(self) -> int:
        """The server's clock (ms), to tell a letter's age from :func:`letter_time_ms` with one clock."""
        async with self._redis("time") as r:
            return time_ms(await r.time())

    async def list(self, limit: int = 20, reason: str | None = None) -> _Letters:
        """The newest ``limit`` letters (newest first), only those whose reason contains ``reason`` if given."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ConfigurationError(f"limit must be an integer >= 0, got {limit!r}")
        wanted = self._reason_filter(reason)
        out: _Letters = []
        async with self._redis("list") as r:
            await self._check_types(r, "list")
            end = "+"
            while len(out) < limit:
                want = PAGE if wanted else limit - len(out)
                page = id_rows(await r.xrevrange(self.key, end, "-", count=want))
                for lid, fields in page:
                    letter = self._letter(lid, fields)
                    if wanted is None or wanted(letter):
                        out.append(letter)
                        if len(out) == limit:
                            break
                if len(page) < want:
                    break
                end = "(" + page[-1][0]
        return out

    async def get(self, letter_id: str) -> DeadLetter | None:
        """The letter ``letter_id``, or None if the stream does not hold it."""
        (letter_id,) = self._ids([letter_id])
        async with self._redis("get") as r:
            await self._check_types(r, "get")
            rows = id_rows(await r.xrange(self.key, letter_id, letter_id, count=1))
        return self._letter(letter_id, rows[0][1]) if rows else None

    async def matching(
        self,
        ids: Iterable[str] | None = None,
        *,
        reason: str | None = None,
        all: bool = False,
        until: str | None = None,
    ) -> tuple[int, str]:
        """How many letters the selection holds now, and the newest id among them ("" if none).

        Pass that id as ``until`` to :meth:`purge` or :meth:`replay` to act on
        no letter written after the count.
        """
        count, newest = 0, ""
        async with self._redis("count") as r:
            await self._check_types(r, "count")
            async for rows in self._walk(r, ids, reason, all, until):
                count += len(rows)
                for lid, _ in rows:
                    if not newest or id_key(lid) > id_key(newest):
                        newest = lid
        return count, newest

    # ------------------------------------------------------------- replay ---

    async def replay(
        self,
        ids: Iterable[str] | None = None,
        *,
        reason: str | None = None,
        all: bool = False,
        until: str | None = None,
        force: bool = False,
    ) -> _Replays:
        """Put the selected letters back into the LBS as fresh assignments (oldest first); one :class:`Replay` each.

        A letter whose ``lbs-input`` a consumer would refuse (not JSON, no
        name, too big) is refused (outcome ``malformed``) unless ``force``.
        Explicit ``ids`` not in the stream come back as ``missing``. Each
        letter moves atomically (see the module docstring).
        """
        return await replay(self, ids, reason=reason, all=all, until=until, force=force)

    async def purge(
        self,
        ids: Iterable[str] | None = None,
        *,
        reason: str | None = None,
        all: bool = False,
        until: str | None = None,
    ) -> int:
        """Delete the selected letters; how many were deleted (ids not in the stream count 0)."""
        deleted = 0
        async with self._redis("purge") as r:
            forwarders = await self._check_types(r, "purge")
            async for rows in self._walk(r, ids, reason, all, until):
                if not rows:
                    continue
                ids_ = [lid for lid, _ in rows]
                pipe = r.pipeline(transaction=True)
                pipe.xdel(self.key, *ids_)
                if forwarders:
                    pipe.xack(self.key, self._forwarders, *ids_)
                replies = await execute(pipe, raise_on_error=False)
                if isinstance(replies[0], Exception):
                    raise RedisOperationError("purge", replies[0])
                deleted += int(replies[0])
        return deleted
