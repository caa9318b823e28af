"""The Lua-free read: the commands a reader sends to take a batch, and how their replies read.

A batch is taken in two writes on the reader's wire, both plain commands:

1. ``XREADGROUP GROUP <group> <consumer> COUNT n [BLOCK ms] STREAMS <LBS> >`` (:func:`read`): the
   entries are delivered, pending to this consumer, parsed by the core (``Shape.XREAD``). A blocking
   read waits in Redis, which serves blocked readers one XADD at a time.
2. The take (:func:`take`), one ``MULTI``/``EXEC``: ``GET`` of the consumer's lease (the entries are
   held only while it holds the process's value: :class:`Take`), ``EXISTS`` of the service's pause
   (a batch taken while the service is paused goes back, no retry counted), ``INCRBY`` of the service's fencing
   counter (one token for the batch: a later holder of a data stream reads it after this one let it
   go, so its token is larger), ``MSETNX`` of the batch's data stream names (all or none; one holder
   per name, :mod:`lbs._redis.lua._names`), and under the notification API ``SADD`` of the ids to the
   consumer's queued set. On a new connection the take first floors the counter at the server's
   clock (``fence-1.lua``: a counter lost with a restart, or behind after a failover, never hands out
   a token twice); an ``INCRBY`` below :data:`TOKEN_FLOOR` (the counter was lost without the
   connection dropping) floors it and takes again.

When ``MSETNX`` set nothing (a name is held, or two entries of the batch share one), ``names-1.lua``
takes the names one by one (:func:`names`): the rare path. The caller is
:mod:`lbs._consumer.reader`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _lbscore import CommandBatch, Shape

from .sources import load
from .wire import exec_replies

__all__ = [
    "FENCE",
    "NAMES",
    "TOKEN_CEILING",
    "TOKEN_FLOOR",
    "Take",
    "floor",
    "names",
    "read",
    "take",
    "take_reply",
]

NAMES = load("names-1")
FENCE = load("fence-1")

#: Every token is at least the server time in microseconds when its counter was floored (10^15 is
#: 2001): a smaller one means the counter was lost.
TOKEN_FLOOR = 10**15
#: Tokens stay below 2^53, exact in a double (Lua's numbers, JSON's).
TOKEN_CEILING = 2**53


def read(
    b: CommandBatch, stream: str, group: str, consumer: str, count: int, block_ms: int = 0
) -> None:
    """``XREADGROUP`` of up to ``count`` new entries (``block_ms`` > 0: waiting that long for one); the
    reply's entries come back as ``Entry`` objects (an empty list when none came)."""
    args: list[Any] = ["XREADGROUP", "GROUP", group, consumer, "COUNT", count]
    if block_ms > 0:
        args += ["BLOCK", block_ms]
    b.command(*args, "STREAMS", stream, ">")
    b.expect(Shape.XREAD)


def take(
    b: CommandBatch,
    fence: str,
    lease_key: str,
    name_pairs: Sequence[tuple[str, str]],
    queued: str = "",
    ids: Sequence[str] = (),
    floor_first: bool = False,
    paused_key: str = "",
) -> None:
    """The take of a batch (see the module): ``name_pairs`` holds ``(name holder key, entry id)`` for
    each entry with a name; ``queued`` (the notification API): the consumer's queued set, which
    ``ids`` join; ``paused_key``: the service's pause (``EXISTS``). :func:`take_reply` reads the
    replies."""
    b.command("MULTI")
    if floor_first:
        b.command("EVALSHA", FENCE.sha, FENCE.fixed_keys, fence)
    b.command("GET", lease_key)
    if paused_key:
        b.command("EXISTS", paused_key)
    b.command("INCRBY", fence, 1)
    if name_pairs:
        flat: list[str] = []
        for key, entry_id in name_pairs:
            flat += (key, entry_id)
        b.command("MSETNX", *flat)
    if queued and ids:
        b.command("SADD", queued, *ids)
    b.command("EXEC")


def floor(b: CommandBatch, fence: str) -> None:
    """``fence-1.lua`` alone: floor the counter at the server's clock (its reply: the counter)."""
    b.command("EVALSHA", FENCE.sha, FENCE.fixed_keys, fence)


@dataclass(frozen=True, slots=True)
class Take:
    """What a take found and did."""

    #: The lease key's value (None: gone), or the error reading it (a key of another type).
    lease: Any
    #: The batch's token, or why there is none (the counter of another type, ...).
    token: int | Exception
    #: Whether MSETNX took every name (None: no name to take, or it failed: see ``names_error``).
    names: bool | None
    #: MSETNX's error (a holder key of another type makes it fail whole), or the floor's.
    error: Exception | None = None
    #: The service was paused when the batch was taken (its pause key existed).
    paused: bool = False


def take_reply(
    replies: list[Any], floored: bool, with_names: bool, with_pause: bool = False
) -> Take:
    """The replies of a :func:`take` (every command's, EXEC's last). A refused transaction (EXECABORT:
    the ACL, a command Redis does not know) is raised: nothing of it ran."""
    out = iter(exec_replies(replies))
    error: Exception | None = None
    if floored:
        f = next(out)
        if isinstance(f, Exception):
            error = f
    lease = next(out)
    paused = next(out) == 1 if with_pause else False
    token = next(out)
    names: bool | None = None
    if with_names:
        got = next(out)
        if isinstance(got, Exception):
            error = error or got
        else:
            names = got == 1
    if not isinstance(token, (int, Exception)):
        token = TypeError(f"INCRBY replied {token!r}")
    return Take(lease, token, names, error, paused)


def names(
    b: CommandBatch, stream: str, group: str, key_prefix: str, pairs: Sequence[tuple[str, str]]
) -> None:
    """``names-1.lua``: take ``pairs`` (``(DataStreamName, entry id)`` each) one by one; the reply holds
    one string per pair: "" (held), ``WAIT <holder id>`` or ``WRONGTYPE <type> <key>``."""
    flat: list[str] = []
    for name, entry_id in pairs:
        flat += (name, entry_id)
    b.command(
        "EVALSHA",
        NAMES.sha,
        NAMES.fixed_keys,
        stream,  # KEYS[1] the LBS
        group,  # ARGV[1]
        key_prefix,  # ARGV[2]
        *flat,  # ARGV[3..] name, entry id, ...
    )
