"""Scheduled registrations: :class:`lbs.Producer` parks them as ``requeue-6.lua`` parks a retry.

A registration due later (``delay=`` or ``at=``) is written, exactly as its LBS entry would be
(``lbs-input`` and the plugins' fields; no retry count, no original id), to the parking stream
``{<service>-input}:delayed``, and its id is scored in the due index ``{<service>-input}:due``
by the server time (ms) it is due: what every consumer's promotion task
(:mod:`lbs._consumer.delays`, ``promote-4.lua``) reads, so any running consumer moves it into the
LBS when due, as a fresh entry, once.

Without Lua the parked id must be known before the ``MULTI`` that writes the entry and scores it,
so the id is chosen here: round trip 1 is ``WATCH`` of the parking stream, ``TIME`` (the server's
clock: the due time is ``TIME`` + the delay, or ``at``) and ``XINFO STREAM`` (its last id); round
trip 2 is ``MULTI``, ``XADD`` with the next ids after both, ``ZADD``, ``EXEC``. A write to the
parking stream in between (a retry parked, one promoted) aborts the ``EXEC`` (nothing written) and
the two are sent again; both go over one connection held for the call.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import redis.asyncio as aioredis

from _lbscore import CommandBatch

from ._redis.wire import Wire, text
from .exceptions import ConfigurationError, RedisOperationError

__all__ = ["MAX_TRIES", "due_ms", "next_ids", "park"]

#: Round trips of ``WATCH`` + ``MULTI`` tried before a busy parking stream fails the call.
MAX_TRIES = 50
_MAX_SEQ = 2**64 - 1


def due_ms(delay: float | timedelta | None, at: datetime | None) -> tuple[bool, int] | None:
    """When a registration is due: ``(False, ms from the server's now)`` for ``delay``, ``(True,
    Unix ms)`` for ``at``, None for now (no delay, a delay of 0, an ``at`` already past on this
    machine's clock). Rounded up to the millisecond: never early. ConfigurationError for both, a
    negative or non-finite delay, a delay that is not seconds or a timedelta, an ``at`` that is not a
    datetime with a time zone."""
    if delay is not None and at is not None:
        raise ConfigurationError("give delay or at, not both")
    if at is not None:
        if not isinstance(at, datetime):
            raise ConfigurationError(f"at must be a datetime, got {type(at).__name__}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise ConfigurationError(
                f"at must carry a time zone (datetime.now(timezone.utc), ...), got the naive {at}"
            )
        when = math.ceil(at.timestamp() * 1000)
        return (True, when) if when > time.time() * 1000 else None
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, (int, float)) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise ConfigurationError(
            f"delay must be seconds (int, float) or a timedelta, got {type(delay).__name__}"
        )
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(f"delay must be a finite number of seconds >= 0, got {delay!r}")
    ms = math.ceil(seconds * 1000)
    return (False, ms) if ms > 0 else None


def _last_id(info: Any) -> tuple[int, int]:
    """The ``last-generated-id`` of an ``XINFO STREAM`` reply (RESP2 list or RESP3 map)."""
    items = info.items() if isinstance(info, Mapping) else zip(info[::2], info[1::2])
    for k, v in items:
        if text(k) == "last-generated-id":
            ms, seq = text(v).split("-")
            return int(ms), int(seq)
    raise TypeError(f"XINFO STREAM replied without last-generated-id: {info!r:.200}")


def next_ids(after: tuple[int, int], now_ms: int, n: int) -> list[str]:
    """``n`` stream ids above ``after``, at the server's ``now_ms`` when that is later (as ``XADD *``)."""
    ms, seq = (now_ms, 0) if now_ms > after[0] else (after[0], after[1] + 1)
    out = []
    for _ in range(n):
        if seq > _MAX_SEQ:
            ms, seq = ms + 1, 0
        out.append(f"{ms}-{seq}")
        seq += 1
    return out


async def park(
    client: aioredis.Redis,
    parked_key: str,
    due_key: str,
    entries: Sequence[Sequence[Any]],
    due: tuple[bool, int],
) -> list[str]:
    """Park ``entries`` (each an entry's flat fields) in ``parked_key``, scored in ``due_key`` by
    ``due``; return their parked ids. One transaction: all of them or none (a command that fails as
    it runs, a due index of the wrong type, is undone and raised). Redis's error is raised as it
    is; a connection failure in round trip 2 leaves it unknown whether they were parked."""
    absolute, ms = due
    wire = Wire(client)
    pkey, dkey = parked_key.encode(), due_key.encode()
    watching = False
    try:
        for _ in range(MAX_TRIES):

            def look(b: CommandBatch) -> None:
                b.command("WATCH", pkey)
                b.command("TIME")
                b.command("XINFO", "STREAM", pkey)

            watched, now, info = await wire.execute(look, retry_safe=True)
            watching = True
            for reply in (watched, now):
                if isinstance(reply, Exception):
                    raise reply
            now_ms = int(text(now[0])) * 1000 + int(text(now[1])) // 1000
            if isinstance(info, Exception):
                if "no such key" not in str(info).lower():
                    raise info  # WRONGTYPE: the parking stream is something else
                last = (0, 0)
            else:
                last = _last_id(info)
            ids = next_ids(last, now_ms, len(entries))
            score = str(ms if absolute else now_ms + ms).encode()

            def write(b: CommandBatch, ids: list[str] = ids, score: bytes = score) -> None:
                b.command("MULTI")
                for i, fields in zip(ids, entries):
                    b.command("XADD", pkey, i, *fields)
                b.command("ZADD", dkey, *(x for i in ids for x in (score, i)))
                b.command("EXEC")

            replies = await wire.execute(write)
            watching = False  # EXEC (or its refusal) ends the WATCH
            done = replies[-1]
            if done is None:
                continue  # the parking stream moved after the WATCH: nothing written, again
            for reply in replies[:-1]:
                if isinstance(reply, Exception):
                    raise reply  # refused when queued: nothing ran
            if isinstance(done, Exception):
                raise done
            failed = next((r for r in done if isinstance(r, Exception)), None)
            if failed is not None:
                await _undo(wire, pkey, dkey, ids, done)
                raise failed
            return ids
        raise RedisOperationError(
            "park", RuntimeError(f"{parked_key} changed under each of {MAX_TRIES} tries to park")
        )
    finally:
        if watching:
            try:
                await wire.execute(lambda b: b.command("UNWATCH"))
            except Exception:  # the connection is dropped with the WATCH
                pass
        await wire.close()


async def _undo(wire: Wire, pkey: bytes, dkey: bytes, ids: list[str], done: list[Any]) -> None:
    """Take back what ran of a transaction of which a command failed (best effort)."""
    added = [i for i, r in zip(ids, done) if not isinstance(r, Exception)]
    scored = not isinstance(done[-1], Exception)

    def build(b: CommandBatch) -> None:
        if added:
            b.command("XDEL", pkey, *added)
        if scored:
            b.command("ZREM", dkey, *ids)

    if added or scored:
        await wire.execute(build)
