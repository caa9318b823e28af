"""Replaying dead letters: each back into the load-balancer stream as a fresh assignment (a keyed
message's to its key), in one MULTI/EXEC per page under WATCH of the dead-letter stream (see
:mod:`lbs.deadletters`)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import ResponseError, WatchError

from .._streamids import id_key
from ..exceptions import RedisOperationError
from ..publisher import publish_in_transaction, published_id
from ._stream import PAGE, LetterStream, as_text, id_rows
from .letters import DeadLetter

__all__ = ["REPLAY_FIELDS", "Replay", "replay"]

#: The fields (after ``Config.field_prefix``) a replay records on the fresh entry.
REPLAY_FIELDS = ("replayed_from", "last_reason", "replay_count")
#: The fields (after the prefix) requeue-6.lua (and commit-1.lua: "key") adds to a dead letter; a replay drops them.
_LETTER_FIELDS = ("reason", "consumer", "failed_id", "key", "traceback")
#: Tries of one page's MULTI/EXEC while other writers keep changing the dead-letter stream.
_WATCH_TRIES = 50


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


Replays = list[Replay]
#: (letter id, the fresh entry or message, its outcome, the key of a keyed message or "")
Moves = list[tuple[str, dict[Any, Any], Replay, str]]


async def replay(
    dl: LetterStream,
    ids: Iterable[str] | None,
    *,
    reason: str | None,
    all: bool,
    until: str | None,
    force: bool,
) -> Replays:
    """:meth:`lbs.DeadLetters.replay`."""
    dl._selection(ids, reason, all)
    wanted = dl._reason_filter(reason)
    if until is not None:
        (until,) = dl._ids([until])
    out: Replays = []
    async with dl._redis("replay") as r:
        forwarders = await dl._check_types(r, "replay", lbs=True)
        if ids is not None:
            for letter_id in dl._ids(ids):
                if until is not None and id_key(letter_id) > id_key(until):
                    continue
                one, _, read = await _replay_rows(
                    dl, r, letter_id, letter_id, 1, wanted, force, forwarders
                )
                out.extend(one if read else [Replay(letter_id, "missing")])
            return out
        start = "-"
        while True:
            done, last, _ = await _replay_rows(
                dl, r, start, until or "+", PAGE, wanted, force, forwarders
            )
            out.extend(done)
            if last is None:
                return out
            start = "(" + last


async def _replay_rows(
    dl: LetterStream,
    r: aioredis.Redis,
    start: str,
    end: str,
    count: int,
    wanted: Callable[[DeadLetter], bool] | None,
    force: bool,
    forwarders: bool,
) -> tuple[Replays, str | None, int]:
    """Replay the matching letters of one page, in one MULTI/EXEC under WATCH of the dead-letter stream.

    Returns what was done, the last id read (None when the page was the last) and how many were read.
    """
    for attempt in range(_WATCH_TRIES):
        async with r.pipeline(transaction=True) as pipe:
            await pipe.watch(dl.key)
            page = id_rows(await pipe.xrange(dl.key, start, end, count=count))
            last = page[-1][0] if len(page) == count else None
            done: Replays = []
            moves: Moves = []
            for lid, fields in page:
                letter = dl._letter(lid, fields)
                if wanted is not None and not wanted(letter):
                    continue
                entry = _fresh(dl, lid, fields, letter)
                if letter.key:  # a keyed message: published again to its key
                    entry.pop(dl.prefix + "original_id", None)
                    entry.pop(dl.prefix + "retry_count", None)
                    moves.append(
                        (lid, entry, Replay(lid, "replayed", stream=letter.key), letter.key)
                    )
                    continue
                judged = dl._judge.parse_entries(
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
                    publish_in_transaction(pipe, dl.service, key, entry)
                else:
                    pipe.xadd(dl.stream, entry)
                pipe.xdel(dl.key, lid)
                if forwarders:
                    pipe.xack(dl.key, dl._forwarders, lid)
            try:
                replies = await pipe.execute(raise_on_error=False)
            except WatchError:
                # Another writer changed the dead-letter stream (a new letter, a forwarder): read again.
                await asyncio.sleep(random.uniform(0, min(0.5, 0.01 * 2**attempt)))
                continue
        step = 3 if forwarders else 2
        lost: list[str] = []
        for k, (lid, entry, result, key) in enumerate(moves):
            added, deleted = replies[k * step], replies[k * step + 1]
            if isinstance(added, Exception):
                # The LBS refused the copy (it was replaced by a key of another type since the check);
                # the letter was deleted in the same EXEC: put it back, under a new id.
                if not isinstance(deleted, Exception) and int(deleted):
                    await r.xadd(dl.key, _raw_fields(dl, lid, entry, key))
                lost.append(f"{lid}: {added}")
                continue
            done.append(
                Replay(
                    lid,
                    "replayed",
                    published_id(added) if key else as_text(added),
                    result.stream,
                    result.detail,
                )
            )
        if lost:
            raise RedisOperationError(
                "replay",
                ResponseError(
                    f"{dl.stream} refused {len(lost)} replayed letters (kept in {dl.key}): "
                    + "; ".join(lost)
                ),
            )
        done.sort(key=lambda x: id_key(x.letter_id))
        return done, last, len(page)
    raise RedisOperationError(
        "replay",
        WatchError(
            f"{dl.key} kept changing under {_WATCH_TRIES} tries of one page; the letters replayed so far "
            "are out of it, try again"
        ),
    )


def _fresh(
    dl: LetterStream, letter_id: str, fields: Mapping[Any, Any], letter: DeadLetter
) -> dict[Any, Any]:
    """The fresh LBS entry a letter comes back as (see the module docstring)."""
    p = dl.prefix
    managed = {
        p + n for n in (*_LETTER_FIELDS, *REPLAY_FIELDS, "retry_count", "original_id", "deaths")
    }
    entry = {k: v for k, v in fields.items() if as_text(k) not in managed}
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
    dl: LetterStream, letter_id: str, entry: Mapping[Any, Any], key: str = ""
) -> dict[Any, Any]:
    """A letter rebuilt from its fresh entry, to put back when the LBS (or the key's publish) refused the copy."""
    p = dl.prefix
    back = {k: v for k, v in entry.items() if as_text(k) not in {p + n for n in REPLAY_FIELDS}}
    back[p + "reason"] = as_text(entry.get(p + "last_reason", ""))
    back[p + "failed_id"] = as_text(entry.get(p + "original_id", letter_id))
    if key:
        back[p + "key"] = key
    return back
