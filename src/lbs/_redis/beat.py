"""The heartbeat's tick without Lua, where the server has ``SET ... IFEQ`` (Redis >= 8.4, Valkey >= 9.1).

One ``MULTI``:

* ``SET <lease> <value> IFEQ <value> PX <ttl> GET`` extends the lease only while it holds this
  take's value, and replies what it held: the value (extended), nil (gone), another value (another
  process took it), or WRONGTYPE (a key of another type): the same diagnosis ``extend-n.lua`` gives;
* ``ZADD <deadlines> <deadline> <consumer>`` moves the consumer's deadline to ``deadline``, the
  server's time plus the TTL as the client estimates it (:class:`ServerClock`, from the previous
  tick's ``TIME``). Unlike the script it is written whether or not the lease was extended: a lost
  lease's holder lives (it is the one ticking) and puts its streams back itself, and a deadline a
  little ahead only sends recovery's poll later to a consumer that is alive;
* ``TIME``, run with the ``SET`` in the one transaction: the next tick's clock.

:func:`tick_notes` turns the replies into ``extend-n.lua``'s notes, so the caller
(:mod:`lbs._consumer.heartbeat`) reads both ways alike. Beside a Go fleet, before the client
knows the server's clock, and on servers without ``SET ... IFEQ`` the tick stays ``extend-n.lua``.
"""

from __future__ import annotations

from typing import Any

from _lbscore import CommandBatch

from . import scripts
from .wire import exec_replies, first_error, text

__all__ = ["ServerClock", "extend", "extend_reply", "tick", "tick_notes"]


class ServerClock:
    """The server's clock as seen from this client's monotonic clock: each ``TIME`` reply is pinned to
    the middle of the round trip that read it, so an estimate is off by at most half that round trip
    (plus the clocks' drift since, microseconds a tick). A failover to a server whose clock differs is
    corrected by the next ``TIME``."""

    __slots__ = ("_at", "_ms")

    def __init__(self) -> None:
        self._ms: float | None = None  # the server's time (ms) at ...
        self._at = 0.0  # ... this monotonic time (s)

    def note(self, reply: Any, sent: float, received: float) -> bool:
        """Record a ``TIME`` reply (``[seconds, microseconds]``) read by a round trip sent at ``sent``
        and answered at ``received`` (monotonic seconds); False when it is not one."""
        try:
            seconds, micros = (int(text(v)) for v in reply)
        except (TypeError, ValueError):
            return False
        self._ms = seconds * 1000 + micros / 1000
        self._at = (sent + received) / 2
        return True

    def now_ms(self, at: float) -> int | None:
        """The server's time (ms) at monotonic time ``at``; None before the first :meth:`note`."""
        if self._ms is None:
            return None
        return int(self._ms + (at - self._at) * 1000)


def tick(
    b: CommandBatch,
    lease_key: str,
    deadlines: str,
    *,
    consumer: str,
    lease: str,
    ttl_ms: int,
    deadline_ms: int,
) -> None:
    """One tick (see the module): extend ``lease_key`` if it holds ``lease``, move ``consumer``'s
    deadline in ``deadlines`` to ``deadline_ms``, read the server's time."""
    b.command("MULTI")
    b.command("SET", lease_key, lease, "IFEQ", lease, "PX", ttl_ms, "GET")
    b.command("ZADD", deadlines, deadline_ms, consumer)
    b.command("TIME")
    b.command("EXEC")


def tick_notes(replies: list[Any], lease: str, deadlines: str) -> tuple[list[str], Any]:
    """The replies of a :func:`tick`: ``extend-n.lua``'s notes ("LEASE <what the key holds>" when the
    lease is not ours; "LBSKEY ..." when the deadline could not be written) and the ``TIME`` reply. A
    refused transaction (EXECABORT: the ACL, a command the server does not know) is raised: nothing of
    it ran."""
    done = exec_replies(replies)
    if len(done) != 3:
        raise TypeError(f"EXEC replied {done!r}, not the tick's three replies")
    held, moved, now = done
    notes: list[str] = []
    if isinstance(held, Exception):
        notes.append(f"LEASE WRONGTYPE ({held})")
    elif held is None or text(held) != lease:
        notes.append("LEASE " + ("" if held is None else text(held)))
    if isinstance(moved, Exception):
        notes.append(f"LBSKEY {deadlines}: {moved}, not the consumer deadline index")
    return notes, None if isinstance(now, Exception) else now


def extend(
    b: CommandBatch,
    stream: str,
    deadlines: str,
    lease_key: str,
    *,
    ttl_ms: int,
    group: str,
    consumer: str,
    lease: str,
    deadline_ms: int | None,
    go: tuple[int, list[str], list[str]] | None,
) -> None:
    """A heartbeat's tick either way: :func:`tick` when ``deadline_ms`` is given, else
    ``extend-n.lua`` (:func:`lbs._redis.scripts.extend`; ``go`` beside a Go fleet) and a ``TIME``.
    :func:`extend_reply` reads the replies."""
    if deadline_ms is not None:
        tick(
            b,
            lease_key,
            deadlines,
            consumer=consumer,
            lease=lease,
            ttl_ms=ttl_ms,
            deadline_ms=deadline_ms,
        )
        return
    scripts.extend(
        b,
        stream,
        deadlines,
        lease_key,
        ttl_ms=ttl_ms,
        group=group,
        consumer=consumer,
        lease=lease,
        go=go,
    )
    b.command("TIME")  # the clock the next tick goes by


def extend_reply(
    replies: list[Any], plain: bool, lease: str, deadlines: str
) -> tuple[list[Any], Any, list[Any]]:
    """The replies of an :func:`extend` (``plain``: a :func:`tick`) and of what the caller added
    after it: ``extend-n.lua``'s reply (negative positions, then notes), the ``TIME`` reply, and the
    caller's replies. The script's error, or the transaction's refusal, is raised."""
    if plain:
        notes, now = tick_notes(replies[:5], lease, deadlines)
        return list(notes), now, replies[5:]
    return first_error(replies[:1])[0], replies[1], replies[2:]
