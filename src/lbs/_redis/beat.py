"""The heartbeat's tick without Lua, where the server has ``SET ... IFEQ`` (Redis >= 8.4, Valkey >= 9.1).

One ``MULTI``:

* ``SET <lease> <value> IFEQ <value> PX <ttl> GET`` extends the lease only while it holds this
  take's value, and replies what it held: the value (extended), nil (gone), another value (another
  process took it), or WRONGTYPE (a key of another type): the same diagnosis ``extend-n.lua`` gives;
* ``ZADD <deadlines> <deadline> <consumer>`` moves the consumer's deadline to ``deadline``, the
  server's time plus the TTL as the client estimates it (:class:`lbs._redis.clock.ServerClock`, from the previous
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

__all__ = ["extend", "extend_reply", "tick", "tick_notes"]


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
