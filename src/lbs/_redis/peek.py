"""A look, without Lua, at whether a poller's script has anything to do.

Recovery's deadline poll (``reap-3.lua``) and the delayed retries' promotion (``promote-4.lua``)
run on timers, and on an idle fleet nearly every call finds nothing due. A script call costs
Redis far more than the few reads that tell so, so each poller first reads, in one pipeline,
``TIME``, the strings it needs (``GET``) and the earliest member of each sorted set it is due by
(``ZRANGE <key> 0 0 WITHSCORES``), and calls its script only when something is due, or when a
reply is anything but what it expects (a key of another type, a refusal): the script then says
what is wrong, as it always did. The callers: :mod:`lbs._consumer.recovery` and
:mod:`lbs._consumer.delays`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _lbscore import CommandBatch

from .wire import text

__all__ = ["Peek", "peek", "peek_reply"]


@dataclass(frozen=True, slots=True)
class Peek:
    """What a :func:`peek` read."""

    #: The server's time, ms (None: not asked, a look at whether anything is there at all).
    now_ms: int | None
    #: Each string's value (None: no such key), in the order asked.
    values: tuple[bytes | None, ...]
    #: Each sorted set's earliest score (None: empty or no such key), in the order asked.
    heads: tuple[float | None, ...]

    def due_in(self) -> float | None:
        """Seconds until the earliest head is due: 0 when one is due now, None when every set is empty."""
        heads = [h for h in self.heads if h is not None]
        if not heads:
            return None
        if self.now_ms is None:
            return 0.0  # something is there, and no clock to judge it by: the script judges
        return max(0.0, (min(heads) - self.now_ms) / 1000)


def peek(
    b: CommandBatch, zsets: Sequence[str], gets: Sequence[str] = (), with_time: bool = True
) -> None:
    """``TIME`` (unless ``with_time`` is False: a poller whose sets were empty at its last look
    only asks whether they still are), a ``GET`` of each of ``gets``, the earliest member of each
    of ``zsets``."""
    if with_time:
        b.command("TIME")
    for key in gets:
        b.command("GET", key)
    for key in zsets:
        b.command("ZRANGE", key, 0, 0, "WITHSCORES")


def peek_reply(replies: list[Any], zsets: int, gets: int = 0, with_time: bool = True) -> Peek:
    """The replies of a :func:`peek` of ``zsets`` sorted sets and ``gets`` strings. The first error
    among them is raised (the caller then leaves the diagnosis to its script), as is a reply of
    another shape (:class:`ValueError`)."""
    t = 1 if with_time else 0
    if len(replies) != t + gets + zsets:
        raise ValueError(f"{len(replies)} replies to a peek of {t + gets + zsets} commands")
    for r in replies:
        if isinstance(r, Exception):
            raise r
    now: int | None = None
    if with_time:
        seconds, micros = (int(text(v)) for v in replies[0])
        now = seconds * 1000 + micros // 1000
    values = tuple(None if v is None else bytes(v) for v in replies[t : t + gets])
    heads: list[float | None] = []
    for head in replies[t + gets :]:
        if not head:
            heads.append(None)
            continue
        score = head[1] if len(head) == 2 and not isinstance(head[0], list) else head[0][1]
        heads.append(float(text(score)))
    return Peek(now, values, tuple(heads))
