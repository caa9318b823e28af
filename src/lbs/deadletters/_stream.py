"""One service's dead-letter stream as the operator's API reaches it: its client (on a cluster, the
slot's master), the key checks, and the letters a call selects, read a page at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from _lbscore import EntryParser

from .. import _keys
from .._admin import ServiceHandle, on_owner
from .._redis.connection import execute
from .._redis.errors import KeyTypeError
from .._redis.wire import fields_text, text
from .._streamids import NOT_AN_ID, id_key, is_stream_id
from ..exceptions import ConfigurationError, LbsError, RedisOperationError
from .letters import DeadLetter

#: Letters read per page when a filter (a reason, all) walks the stream.
PAGE = 200

#: A letter as read: its id and its fields, the values as Redis returned them (bytes, or str
#: for a client with ``decode_responses``), so a replay copies them unchanged.
Raw = tuple[str, dict[Any, Any]]
# Aliases for annotations inside DeadLetters, whose method ``list`` hides the builtin there.
Rows = list[Raw]
Ids = list[str]


def id_rows(reply: Any) -> list[tuple[str, Any]]:
    """An XRANGE/XREVRANGE reply as (id, fields) pairs, ids as text."""
    return [(as_text(lid), fields) for lid, fields in reply or ()]


def as_text(value: Any) -> str:
    return text(value, "replace")


class LetterStream(ServiceHandle):
    """A service's dead-letter stream, its load-balancer stream and the client that reaches them."""

    def _configured(self) -> None:
        if self.config.dead_letter_stream == "":
            raise ConfigurationError(
                'Config.dead_letter_stream is "": this service\'s dead letters are dropped, '
                "there is no dead-letter stream to read"
            )
        self.prefix = self.config.field_prefix
        #: The dead-letter stream (the load-balancer stream is ``stream``).
        self.key = self.config.dead_letter_stream or _keys.dead_letter_stream(self.service)
        self._forwarders = _keys.dead_letter_group(self.service)
        # A replayed entry is judged by the consumers' own parser, as the producer judges new ones.
        self._judge = EntryParser(
            _keys.INPUT_FIELD,
            self.prefix + "retry_count",
            self.prefix + "original_id",
            max_input_bytes=self.config.max_input_bytes,
        )

    async def aclose(self) -> None:
        """Close the Redis client if it was opened here (from a URL)."""
        if self._owned:
            self._owned = False
            await self._client.aclose()

    # ---------------------------------------------------- selecting letters ---

    def _letter(self, letter_id: str, fields: Any) -> DeadLetter:
        return DeadLetter(letter_id, fields_text(fields), self.prefix)

    @staticmethod
    def _reason_filter(reason: str | None) -> Callable[[DeadLetter], bool] | None:
        if reason is None:
            return None
        if not isinstance(reason, str) or not reason:
            raise ConfigurationError(f"reason must be a non-empty str, got {reason!r}")
        needle = reason.casefold()
        return lambda letter: needle in letter.reason.casefold()

    @staticmethod
    def _ids(ids: Iterable[str]) -> Ids:
        if isinstance(ids, (str, bytes)):
            raise ConfigurationError("ids must be a list of dead-letter ids, not one string")
        out: dict[str, None] = {}
        for letter_id in ids:
            if not isinstance(letter_id, str) or not is_stream_id(letter_id):
                raise ConfigurationError(f"{letter_id!r} is {NOT_AN_ID}")
            out[letter_id] = None
        return list(out)

    @staticmethod
    def _selection(ids: Iterable[str] | None, reason: str | None, all: bool) -> None:
        if ids is not None and all:
            raise ConfigurationError("give ids or all=True, not both")
        if ids is None and reason is None and not all:
            raise ConfigurationError("say which letters: ids, reason=..., or all=True")

    async def _walk(
        self,
        r: aioredis.Redis,
        ids: Iterable[str] | None,
        reason: str | None,
        all: bool,
        until: str | None,
    ) -> AsyncIterator[Rows]:
        """The selected letters, a page at a time, oldest first."""
        self._selection(ids, reason, all)
        if until is not None:
            (until,) = self._ids([until])
        wanted = self._reason_filter(reason)
        if ids is not None:
            chosen = [i for i in self._ids(ids) if until is None or id_key(i) <= id_key(until)]
            for k in range(0, len(chosen), PAGE):
                pipe = r.pipeline(transaction=False)
                for letter_id in chosen[k : k + PAGE]:
                    pipe.xrange(self.key, letter_id, letter_id, count=1)
                replies = await execute(pipe)
                yield [
                    (as_text(rows[0][0]), rows[0][1])
                    for rows in replies
                    if rows
                    and (wanted is None or wanted(self._letter(as_text(rows[0][0]), rows[0][1])))
                ]
            return
        start = "-"
        while True:
            page = id_rows(await r.xrange(self.key, start, until or "+", count=PAGE))
            yield [(lid, f) for lid, f in page if wanted is None or wanted(self._letter(lid, f))]
            if len(page) < PAGE:
                return
            start = "(" + page[-1][0]

    async def _check_types(self, r: aioredis.Redis, operation: str, *, lbs: bool = False) -> bool:
        """Refuse keys of the wrong type (naming them); whether the forwarders' group exists."""
        pipe = r.pipeline(transaction=False)
        pipe.type(self.key)
        pipe.type(self.stream)
        pipe.xinfo_groups(self.key)
        dlq_type, lbs_type, groups = await execute(pipe, raise_on_error=False)
        for reply in (dlq_type, lbs_type):
            if isinstance(reply, Exception):
                raise RedisOperationError(operation, reply)
        for key, kind, what, needed in (
            (self.key, as_text(dlq_type), "the dead-letter stream", True),
            (self.stream, as_text(lbs_type), "the load-balancer stream", lbs),
        ):
            if needed and kind not in ("none", "stream"):
                raise RedisOperationError(
                    operation, KeyTypeError(f"LBSKEY {key} holds a {kind}, not {what}")
                )
        if isinstance(groups, Exception):
            return False  # no such key (no letters yet): no group either
        return any(
            as_text(dict(g).get("name", dict(g).get(b"name", ""))) == self._forwarders
            for g in groups
        )

    @asynccontextmanager
    async def _redis(self, operation: str) -> AsyncIterator[aioredis.Redis]:
        """A plain client for the dead-letter stream's Redis (on a cluster, its slot's owner)."""
        try:
            async with on_owner(self._client, self.key) as (r, _):
                yield r
        except LbsError:
            raise
        except RedisError as exc:
            raise RedisOperationError(operation, exc) from exc
