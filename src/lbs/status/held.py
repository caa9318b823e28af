"""Rounds 3 to 6 of a status read, only when there is something to show: what each consumer holds
(its data streams' names and fencing tokens, from its token records), the held keys of keyed processing, and the names whose
registrations wait for their holder."""

from __future__ import annotations

import redis.asyncio as aioredis

from _lbscore import decode_input

from .. import _keys
from .._redis.connection import execute, waiting_names
from .._redis.wire import fields_text, text
from .._streamids import id_ms
from ..exceptions import LbsError
from .records import HeldStream, KeyStatus, NameWait
from .snapshot import Target, check, counter, keyed, s

#: Names with waiting registrations read by rounds 5 and 6 (at most ``sample``).
WAITING_NAMES_SHOWN = 50


async def names_waiting(r: aioredis.Redis, t: Target) -> tuple[NameWait, ...]:
    """Rounds 5 and 6: the first names of the waiting index (at most ``sample`` and
    :data:`WAITING_NAMES_SHOWN`), then, in one plain pipeline, each one's holder key and waiting
    list's length."""
    names = await waiting_names(r, t.service, min(t.sample, WAITING_NAMES_SHOWN))
    holder, listed = (
        _keys.name_holder(t.service, "").encode(),
        _keys.waiting_list(t.service, "").encode(),
    )
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.get(holder + name)
        pipe.llen(listed + name)
    replies = await execute(pipe, raise_on_error=False)
    out = []
    for i, name in enumerate(names):
        value, waiting = replies[2 * i], replies[2 * i + 1]
        # A key of another type (garbage lbs leaves alone) shows as held by nobody, nothing waiting.
        value = "" if isinstance(value, Exception) or value is None else s(value)
        back = value.startswith("+")
        out.append(
            NameWait(
                text(name, "replace"),
                value.strip("+"),
                back,
                0 if isinstance(waiting, Exception) else int(waiting),
            )
        )
    return tuple(out)


async def holdings(
    r: aioredis.Redis, t: Target, now: int
) -> tuple[dict[str, tuple[HeldStream, ...]], tuple[KeyStatus, ...]]:
    """Rounds 3 and 4 (plain pipelines): the first ``sample`` pending entries, their data streams'
    names and their holders' token records (by consumer); then, for each, the key's state and data stream length. Keys
    without a state are left out (the service is not keyed, or the key was let go meanwhile)."""
    pending = check(
        "XPENDING range",
        await r.xpending_range(t.stream, t.group, "-", "+", t.sample),
    )
    held = [
        (
            s(p.get("message_id")),
            s(p.get("consumer")),
            int(p.get("time_since_delivered") or 0),
        )
        for p in map(keyed, pending)
    ]
    consumers = sorted({c for _, c, _ in held})
    pipe = r.pipeline(transaction=False)
    for entry_id, _, _ in held:
        pipe.xrange(t.stream, entry_id, entry_id, count=1)
    for consumer in consumers:
        pipe.hgetall(_keys.tokens_prefix(t.service) + consumer)
    replies = await execute(pipe, raise_on_error=False)
    records = {c: _Records(v) for c, v in zip(consumers, replies[len(held) :])}
    names = []
    by_consumer: dict[str, list[HeldStream]] = {}
    for (entry_id, consumer, idle), entries in zip(held, replies):
        name = ""
        if not isinstance(entries, Exception) and entries:
            try:
                name = decode_input(fields_text(entries[0][1]).get(_keys.INPUT_FIELD, ""))[0]
                names.append((name, entry_id, consumer))
            except (LbsError, ValueError, AttributeError):
                pass
        by_consumer.setdefault(consumer, []).append(
            HeldStream(
                name,
                entry_id,
                records[consumer].token(entry_id),
                max(0, now - id_ms(entry_id)),
                idle,
            )
        )
    streams = {c: tuple(rows) for c, rows in by_consumer.items()}
    if not names:
        return streams, ()
    pipe = r.pipeline(transaction=False)
    for key, _, _ in names:
        pipe.hmget(
            _keys.key_state(t.service, key),
            "holder",
            "pos",
            "tries",
            "fails",
            "unblamed",
            "until",
        )
        pipe.xlen(_keys.keyed_stream(t.service, key))
    replies = await execute(pipe, raise_on_error=False)
    rows = []
    for (key, entry_id, consumer), state, length in zip(names, replies[::2], replies[1::2]):
        if isinstance(state, Exception) or isinstance(length, Exception) or not any(state):
            continue
        holder, pos, tries, fails, unblamed, until = (s(v) for v in state)
        failures = counter(fails) + counter(unblamed)
        rows.append(
            KeyStatus(
                key,
                consumer,
                entry_id,
                pos,
                int(length),
                counter(tries),
                holder == entry_id,
                failures,
                bool(until) or counter(fails) > 0,
            )
        )
    return streams, tuple(sorted(rows, key=lambda k: (-k.backlog, k.key)))


class _Records:
    """A consumer's token records (``{<service>-input}:tokens:<id>``): each batch's token, and the lease
    value it was taken under and the range of entry ids it read (``<lease>|<first>..<last>``) or the
    ids it took (``<lease>|<id> <id> ...``). A record of another shape, or a key of
    another type, knows no token."""

    def __init__(self, reply: object) -> None:
        self.ranges: list[tuple[tuple[int, int], tuple[int, int], int]] = []
        self.listed: dict[str, int] = {}
        if not isinstance(reply, dict):
            return
        for field, value in reply.items():
            token = s(field)
            if not token.isdigit():
                continue
            _, _, ids = s(value).rpartition("|")  # "<lease value>|<ids>"
            first, dots, last = ids.partition("..")
            if dots and _id(first) and _id(last):
                self.ranges.append((_id(first), _id(last), int(token)))  # type: ignore[arg-type]
            else:
                self.listed.update(dict.fromkeys(ids.split(), int(token)))

    def token(self, entry_id: str) -> int | None:
        if entry_id in self.listed:
            return self.listed[entry_id]
        at = _id(entry_id)
        return next((t for lo, hi, t in self.ranges if at and lo <= at <= hi), None)


def _id(entry_id: str) -> tuple[int, int] | None:
    ms, dash, seq = entry_id.partition("-")
    return (int(ms), int(seq)) if dash and ms.isdigit() and seq.isdigit() else None
