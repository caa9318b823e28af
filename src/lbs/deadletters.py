"""Dead letters as a backend receives them, and the backend's protocol (hook ``lbs_dead_letter_backend``).

The re-queue script writes dead letters to the service's dead-letter stream
atomically with taking them out of circulation; that stream is what makes
"nothing lost" true. A backend (hook ``lbs_dead_letter_backend``) forwards
them further: a JSON-lines file, another Redis, a database. The forwarder
deletes a dead letter from the stream only after the backend's ``write``
returned (confirmed); a write that raises leaves the batch in the stream,
and it is written again later. Delivery to the backend is therefore
at-least-once: a crash between a confirmed write and the delete writes that
batch again, so a backend that must not see duplicates keys on
:attr:`DeadLetter.id`.

Every client with a backend forwards, in the consumer group
``<service>-dlq-forwarders`` on the dead-letter stream (each letter goes to
one forwarder; a forwarder first retries its own unconfirmed letters, and
takes over those another forwarder left unconfirmed for
``Config.dead_letter_claim_idle`` seconds). The forwarding task is
lbs._consumer.forwarder.

:class:`DeadLetters` is the operator's side (``lbs dlq``): list, show,
replay and purge the letters still in the stream. A replay puts a letter
back into the load-balancer stream as a fresh assignment with its full
retries again: its fields (``lbs-input`` and any others) are kept, the
retry count is 0, ``<prefix>original_id`` is kept (the entry's first id;
``<prefix>failed_id`` when the letter has none), and the letter's own fields
(``<prefix>reason``, ``<prefix>consumer``, ``<prefix>failed_id``,
``<prefix>key`` and ``<prefix>traceback``) give way
to a record of where it came from: ``<prefix>replayed_from`` (the letter's
id), ``<prefix>last_reason`` (its reason) and ``<prefix>replay_count``
(replays of this assignment so far, this one included). The prefix is
``Config.field_prefix``, ``_`` by default. Each letter moves in one
MULTI/EXEC (XADD to the LBS, XDEL from the dead-letter stream, and XACK in
the forwarders' group when there is one), under WATCH of the dead-letter
stream, so a letter another replay (or a purge, or a forwarder) took
meanwhile is not replayed twice.

A keyed message's letter (``run_keyed()`` skipped it: it carries
``<prefix>key``) is published again to its key instead, as
:class:`lbs.Publisher` does (``publish-1.lua`` in the same MULTI/EXEC: the
message is appended to the key's data stream, after the messages published
since, and the key registered unless it is already): its fields, with the
same replay record and without the letter's own.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError, WatchError

from _lbscore import EntryParser

from . import _keys
from ._redis.connection import ClusterMode, RedisLike, resolve_client, slot_owner
from ._redis.wire import fields_text, text
from .config import Config
from .exceptions import ConfigurationError, LbsError, RedisOperationError
from .publisher import publish_in_transaction, published_id

__all__ = [
    "REPLAY_FIELDS",
    "DeadLetter",
    "DeadLetterBackend",
    "DeadLetters",
    "Replay",
    "letter_time_ms",
]


@dataclass(frozen=True)
class DeadLetter:
    """One entry of the dead-letter stream, as a backend receives it."""

    #: Its id in the dead-letter stream (unique per letter: a key for de-duplication).
    id: str
    #: Every field, decoded as UTF-8 (invalid bytes replaced).
    fields: Mapping[str, str] = field(default_factory=dict)
    #: The managed-field prefix (``Config.field_prefix``).
    prefix: str = "_"

    @property
    def reason(self) -> str:
        return self.fields.get(self.prefix + "reason", "")

    @property
    def consumer(self) -> str:
        return self.fields.get(self.prefix + "consumer", "")

    @property
    def failed_id(self) -> str:
        """The LBS entry that failed."""
        return self.fields.get(self.prefix + "failed_id", "")

    @property
    def retry_count(self) -> int:
        try:
            return int(self.fields.get(self.prefix + "retry_count", "0"))
        except ValueError:
            return 0

    @property
    def traceback(self) -> str:
        """The failure's traceback (its last 8,192 characters), "" when the failure had none (a lost lock,
        a malformed entry)."""
        return self.fields.get(self.prefix + "traceback", "")

    @property
    def key(self) -> str:
        """The key of a keyed message's letter (``run_keyed()``); "" for an assignment's."""
        return self.fields.get(self.prefix + "key", "")

    @property
    def lbs_input(self) -> str:
        """The assignment's ``lbs-input`` JSON, as it was (possibly malformed)."""
        return self.fields.get(_keys.INPUT_FIELD, "")

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "reason", "consumer", "failed_id", "retry_count", "key", "traceback", "fields"}``: JSON-ready."""
        return {
            "id": self.id,
            "reason": self.reason,
            "consumer": self.consumer,
            "failed_id": self.failed_id,
            "retry_count": self.retry_count,
            "key": self.key,
            "traceback": self.traceback,
            "fields": dict(self.fields),
        }


@runtime_checkable
class DeadLetterBackend(Protocol):
    """Where dead letters go after the dead-letter stream (hook ``lbs_dead_letter_backend``)."""

    #: Shown in logs and metric labels.
    name: str

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Write ``letters`` durably; return only once they are. Raise if not written."""


# ------------------------------------------------------------ the operator's side ---

#: The fields (after ``Config.field_prefix``) a replay records on the fresh entry.
REPLAY_FIELDS = ("replayed_from", "last_reason", "replay_count")
#: The fields (after the prefix) requeue-6.lua (and commit-1.lua: "key") adds to a dead letter; a replay drops them.
_LETTER_FIELDS = ("reason", "consumer", "failed_id", "key", "traceback")
_STREAM_ID = re.compile(r"[0-9]+-[0-9]+\Z")
#: Letters read per page when a filter (a reason, all) walks the stream.
_PAGE = 200
#: Tries of one page's MULTI/EXEC while other writers keep changing the dead-letter stream.
_WATCH_TRIES = 50

#: A letter as read: its id and its fields, the values as Redis returned them (bytes, or str
#: for a client with ``decode_responses``), so a replay copies them unchanged.
_Raw = tuple[str, dict[Any, Any]]


def letter_time_ms(letter_id: str) -> int:
    """When a dead letter was written: its id's milliseconds (the server's clock)."""
    return int(letter_id.partition("-")[0])


def _rows(reply: Any) -> list[tuple[str, Any]]:
    """An XRANGE/XREVRANGE reply as (id, fields) pairs, ids as text."""
    return [(_text(lid), fields) for lid, fields in reply or ()]


def _text(value: Any) -> str:
    return text(value, "replace")


def _as_bytes(value: Any) -> bytes:
    return (
        bytes(value)
        if isinstance(value, (bytes, bytearray, memoryview))
        else str(value).encode("utf-8", "surrogatepass")
    )


@dataclass(frozen=True)
class Replay:
    """What :meth:`DeadLetters.replay` did with one dead letter."""

    #: The letter's id in the dead-letter stream.
    letter_id: str
    #: ``replayed``: it is a fresh entry in the LBS (:attr:`entry_id`) and gone from the dead-letter
    #: stream; ``malformed``: refused, its ``lbs-input`` is not a valid assignment (:attr:`detail`
    #: says why; ``force=True`` replays it anyway); ``missing``: not in the dead-letter stream
    #: (never there, or replayed, purged or forwarded meanwhile).
    outcome: Literal["replayed", "malformed", "missing"]
    #: The fresh entry's id in the load-balancer stream ("" unless replayed).
    entry_id: str = ""
    #: The data stream's name ("" when its ``lbs-input`` cannot be decoded).
    stream: str = ""
    #: Why it was refused (outcome ``malformed``), or, when forced, why it would have been.
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "letter_id": self.letter_id,
            "outcome": self.outcome,
            "entry_id": self.entry_id,
            "stream": self.stream,
            "detail": self.detail,
        }


# Aliases for annotations inside DeadLetters, whose method ``list`` hides the builtin there.
_Letters = list[DeadLetter]
_Replays = list[Replay]
_Rows = list[_Raw]
_Ids = list[str]
#: (letter id, the fresh entry or message, its outcome, the key of a keyed message or "")
_Moves = list[tuple[str, dict[Any, Any], Replay, str]]


class DeadLetters:
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

    def __init__(
        self,
        redis: RedisLike,
        service: str,
        *,
        config: Config | None = None,
        cluster: bool | ClusterMode = ClusterMode.NONE,
    ) -> None:
        self.service = _keys.validate_service(service)
        if config is not None and not isinstance(config, Config):
            raise ConfigurationError(f"config must be an lbs.Config, got {type(config).__name__}")
        self.config = config or Config()
        if self.config.dead_letter_stream == "":
            raise ConfigurationError(
                'Config.dead_letter_stream is "": this service\'s dead letters are dropped, '
                "there is no dead-letter stream to read"
            )
        self.prefix = self.config.field_prefix
        #: The dead-letter stream and the load-balancer stream.
        self.key = self.config.dead_letter_stream or _keys.dead_letter_stream(service)
        self.stream = _keys.input_stream(service)
        self._forwarders = _keys.dead_letter_group(service)
        self._client, self._owned = resolve_client(redis, cluster=cluster)
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

    async def __aenter__(self) -> DeadLetters:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------- reading ---

    async def count(self) -> int:
        """How many letters the dead-letter stream holds."""
        async with self._redis("count") as r:
            await self._check_types(r, "count")
            return int(await r.xlen(self.key))

    async def server_time_ms(self) -> int:
        """The server's clock (ms), to tell a letter's age from :func:`letter_time_ms` with one clock."""
        async with self._redis("time") as r:
            seconds, micros = await r.time()
            return int(seconds) * 1000 + int(micros) // 1000

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
                want = _PAGE if wanted else limit - len(out)
                page = _rows(await r.xrevrange(self.key, end, "-", count=want))
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
            rows = _rows(await r.xrange(self.key, letter_id, letter_id, count=1))
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
                    if not newest or _id_key(lid) > _id_key(newest):
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
        self._selection(ids, reason, all)
        wanted = self._reason_filter(reason)
        if until is not None:
            (until,) = self._ids([until])
        out: _Replays = []
        async with self._redis("replay") as r:
            forwarders = await self._check_types(r, "replay", lbs=True)
            if ids is not None:
                for letter_id in self._ids(ids):
                    if until is not None and _id_key(letter_id) > _id_key(until):
                        continue
                    one, _, read = await self._replay_rows(
                        r, letter_id, letter_id, 1, wanted, force, forwarders
                    )
                    out.extend(one if read else [Replay(letter_id, "missing")])
                return out
            start = "-"
            while True:
                done, last, _ = await self._replay_rows(
                    r, start, until or "+", _PAGE, wanted, force, forwarders
                )
                out.extend(done)
                if last is None:
                    return out
                start = "(" + last

    async def _replay_rows(
        self,
        r: aioredis.Redis,
        start: str,
        end: str,
        count: int,
        wanted: Callable[[DeadLetter], bool] | None,
        force: bool,
        forwarders: bool,
    ) -> tuple[_Replays, str | None, int]:
        """Replay the matching letters of one page, in one MULTI/EXEC under WATCH of the dead-letter stream.

        Returns what was done, the last id read (None when the page was the last) and how many were read.
        """
        for attempt in range(_WATCH_TRIES):
            async with r.pipeline(transaction=True) as pipe:
                await pipe.watch(self.key)
                page = _rows(await pipe.xrange(self.key, start, end, count=count))
                last = page[-1][0] if len(page) == count else None
                done: _Replays = []
                moves: _Moves = []
                for lid, fields in page:
                    letter = self._letter(lid, fields)
                    if wanted is not None and not wanted(letter):
                        continue
                    entry = self._fresh(lid, fields, letter)
                    if letter.key:  # a keyed message: published again to its key
                        entry.pop(self.prefix + "original_id", None)
                        entry.pop(self.prefix + "retry_count", None)
                        moves.append(
                            (lid, entry, Replay(lid, "replayed", stream=letter.key), letter.key)
                        )
                        continue
                    judged = self._judge.parse_entries(
                        [[b"0-0", [x for kv in entry.items() for x in map(_as_bytes, kv)]]]
                    )[0]
                    stream, detail = judged.stream or "", judged.error or ""
                    if judged.error is not None and not force:
                        done.append(Replay(lid, "malformed", stream=stream, detail=detail))
                        continue
                    moves.append(
                        (lid, entry, Replay(lid, "replayed", stream=stream, detail=detail), "")
                    )
                if not moves:
                    await pipe.unwatch()  # type: ignore[no-untyped-call]
                    return done, last, len(page)
                pipe.multi()  # type: ignore[no-untyped-call]
                for lid, entry, _, key in moves:
                    if key:
                        publish_in_transaction(pipe, self.service, key, entry)
                    else:
                        pipe.xadd(self.stream, entry)
                    pipe.xdel(self.key, lid)
                    if forwarders:
                        pipe.xack(self.key, self._forwarders, lid)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                except WatchError:
                    # Another writer changed the dead-letter stream (a new letter, a forwarder): read again.
                    await asyncio.sleep(random.uniform(0, min(0.5, 0.01 * 2**attempt)))
                    continue
            step = 3 if forwarders else 2
            lost: _Ids = []
            for k, (lid, entry, result, key) in enumerate(moves):
                added, deleted = replies[k * step], replies[k * step + 1]
                if isinstance(added, Exception):
                    # The LBS refused the copy (it was replaced by a key of another type since the check);
                    # the letter was deleted in the same EXEC: put it back, under a new id.
                    if not isinstance(deleted, Exception) and int(deleted):
                        await r.xadd(self.key, self._raw_fields(lid, entry, key))
                    lost.append(f"{lid}: {added}")
                    continue
                done.append(
                    Replay(
                        lid,
                        "replayed",
                        published_id(added) if key else _text(added),
                        result.stream,
                        result.detail,
                    )
                )
            if lost:
                raise RedisOperationError(
                    "replay",
                    ResponseError(
                        f"{self.stream} refused {len(lost)} replayed letters (kept in {self.key}): "
                        + "; ".join(lost)
                    ),
                )
            done.sort(key=lambda x: _id_key(x.letter_id))
            return done, last, len(page)
        raise RedisOperationError(
            "replay",
            WatchError(
                f"{self.key} kept changing under {_WATCH_TRIES} tries of one page; the letters replayed so far "
                "are out of it, try again"
            ),
        )

    def _fresh(
        self, letter_id: str, fields: Mapping[Any, Any], letter: DeadLetter
    ) -> dict[Any, Any]:
        """The fresh LBS entry a letter comes back as (see the module docstring)."""
        p = self.prefix
        managed = {
            p + n for n in (*_LETTER_FIELDS, *REPLAY_FIELDS, "retry_count", "original_id", "deaths")
        }
        entry = {k: v for k, v in fields.items() if _text(k) not in managed}
        original = letter.fields.get(p + "original_id") or letter.failed_id
        try:
            replays = int(letter.fields.get(p + "replay_count", "0")) + 1
        except ValueError:
            replays = 1
        entry[p + "retry_count"] = "0"
        if original:
            entry[p + "original_id"] = original
        entry[p + "replayed_from"] = letter_id
        entry[p + "last_reason"] = letter.reason
        entry[p + "replay_count"] = str(replays)
        return entry

    def _raw_fields(
        self, letter_id: str, entry: Mapping[Any, Any], key: str = ""
    ) -> dict[Any, Any]:
        """A letter rebuilt from its fresh entry, to put back when the LBS (or the key's publish) refused the copy."""
        p = self.prefix
        back = {k: v for k, v in entry.items() if _text(k) not in {p + n for n in REPLAY_FIELDS}}
        back[p + "reason"] = _text(entry.get(p + "last_reason", ""))
        back[p + "failed_id"] = _text(entry.get(p + "original_id", letter_id))
        if key:
            back[p + "key"] = key
        return back

    # -------------------------------------------------------------- purge ---

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
                try:
                    replies = await pipe.execute(raise_on_error=False)
                finally:
                    await pipe.reset()  # type: ignore[no-untyped-call]
                if isinstance(replies[0], Exception):
                    raise RedisOperationError("purge", replies[0])
                deleted += int(replies[0])
        return deleted

    # ------------------------------------------------------------ helpers ---

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
    def _ids(ids: Iterable[str]) -> _Ids:
        if isinstance(ids, (str, bytes)):
            raise ConfigurationError("ids must be a list of dead-letter ids, not one string")
        out: dict[str, None] = {}
        for letter_id in ids:
            if not isinstance(letter_id, str) or not _STREAM_ID.match(letter_id):
                raise ConfigurationError(
                    f"{letter_id!r} is not a stream id (<milliseconds>-<sequence>)"
                )
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
    ) -> AsyncIterator[_Rows]:
        """The selected letters, a page at a time, oldest first."""
        self._selection(ids, reason, all)
        if until is not None:
            (until,) = self._ids([until])
        wanted = self._reason_filter(reason)
        if ids is not None:
            chosen = [i for i in self._ids(ids) if until is None or _id_key(i) <= _id_key(until)]
            for k in range(0, len(chosen), _PAGE):
                pipe = r.pipeline(transaction=False)
                for letter_id in chosen[k : k + _PAGE]:
                    pipe.xrange(self.key, letter_id, letter_id, count=1)
                try:
                    replies = await pipe.execute()
                finally:
                    await pipe.reset()  # type: ignore[no-untyped-call]
                yield [
                    (_text(rows[0][0]), rows[0][1])
                    for rows in replies
                    if rows
                    and (wanted is None or wanted(self._letter(_text(rows[0][0]), rows[0][1])))
                ]
            return
        start = "-"
        while True:
            page = _rows(await r.xrange(self.key, start, until or "+", count=_PAGE))
            yield [(lid, f) for lid, f in page if wanted is None or wanted(self._letter(lid, f))]
            if len(page) < _PAGE:
                return
            start = "(" + page[-1][0]

    async def _check_types(self, r: aioredis.Redis, operation: str, *, lbs: bool = False) -> bool:
        """Refuse keys of the wrong type (naming them); whether the forwarders' group exists."""
        pipe = r.pipeline(transaction=False)
        pipe.type(self.key)
        pipe.type(self.stream)
        pipe.xinfo_groups(self.key)
        try:
            dlq_type, lbs_type, groups = await pipe.execute(raise_on_error=False)
        finally:
            await pipe.reset()  # type: ignore[no-untyped-call]
        for reply in (dlq_type, lbs_type):
            if isinstance(reply, Exception):
                raise RedisOperationError(operation, reply)
        for key, kind, what, needed in (
            (self.key, _text(dlq_type), "the dead-letter stream", True),
            (self.stream, _text(lbs_type), "the load-balancer stream", lbs),
        ):
            if needed and kind not in ("none", "stream"):
                raise RedisOperationError(
                    operation, ResponseError(f"LBSKEY {key} holds a {kind}, not {what}")
                )
        if isinstance(groups, Exception):
            return False  # no such key (no letters yet): no group either
        return any(
            _text(dict(g).get("name", dict(g).get(b"name", ""))) == self._forwarders for g in groups
        )

    @asynccontextmanager
    async def _redis(self, operation: str) -> AsyncIterator[aioredis.Redis]:
        """A plain client for the dead-letter stream's Redis (on a cluster, its slot's owner)."""
        client = self._client
        node: aioredis.Redis | None = None
        try:
            if isinstance(client, RedisCluster):
                node, _ = await slot_owner(client, self.key)
                yield node
            else:
                yield client
        except LbsError:
            raise
        except RedisError as exc:
            raise RedisOperationError(operation, exc) from exc
        finally:
            if node is not None:
                await node.aclose()


def _id_key(letter_id: str) -> tuple[int, int]:
    ms, _, seq = letter_id.partition("-")
    return int(ms), int(seq or 0)
