"""Finishing a batch of held streams: ack, delete, release the names (see :mod:`lbs._redis.scripts`).

Two ways, one outcome per entry (:class:`DoneCode`):

* **without Lua** where the server has the commands (Redis >= 8.4): one pipeline of
  ``XACKDEL <LBS> <group> IDS n <ids>`` (acks and deletes what is still pending, each id alone) and
  one ``DELEX <name key> IFEQ <entry id>`` per name, which frees a name nobody waits for. An entry id
  is only ever pending to the consumer it was first delivered to (recovery re-queues a copy under a
  new id; it never moves an entry), so no lease check is needed: a holder whose lease lapsed acks
  what nobody else has, and after a re-queue its old id is gone (``XACKDEL`` says -1, the name key
  holds another value). A name whose key held anything else ("<id>+": registrations wait) goes to
  ``release-1.lua``, which hands it on to the oldest waiter: the rare path, a second round trip;
* **``done-n.lua``** on Redis 7.x and Valkey (no ``XACKDEL``/``DELEX``) and beside a Go fleet
  (``Config.go_compatible``: a Go consumer may XCLAIM a live entry, which only the script checks).

The caller is :mod:`lbs._consumer.finisher`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from _lbscore import CommandBatch

from .sources import load

__all__ = [
    "DONE",
    "RELEASE",
    "DoneCode",
    "done",
    "done_codes",
    "plain_codes",
    "plain_done",
    "release",
]

DONE = load("done-n")
RELEASE = load("release-1")


class DoneCode(enum.IntEnum):
    """Per-entry outcomes of a finished batch (``done-n.lua``'s digits; the pipeline's the same)."""

    DONE = 1
    #: The entry is no longer pending to us (re-queued once our lease lapsed, handed on), or, from
    #: ``done-n.lua``, the lease it was read under is gone: nothing acked (the stream may run twice).
    LOCK_LOST = 3
    #: A retried call (its first reply was lost) found the entry already finished.
    ALREADY_DONE = 4
    #: Beside a Go fleet: a Go consumer took the entry (pending to another consumer, or its Go-style
    #: lock holds another name); nothing acked.
    TAKEN = 5


# -------------------------------------------------------- the Lua-free done ---


def plain_done(
    b: CommandBatch,
    stream: str,
    group: str,
    entry_ids: Sequence[str],
    name_keys: Sequence[str],
) -> None:
    """Finish a batch without Lua: ``XACKDEL`` of ``entry_ids``, then ``DELEX <key> IFEQ <id>`` for each
    entry's name holder key in ``name_keys`` ("" for an entry whose name is not held: none sent).
    :func:`plain_codes` reads the replies."""
    b.command("XACKDEL", stream, group, "IDS", len(entry_ids), *entry_ids)
    for key, entry_id in zip(name_keys, entry_ids):
        if key:
            b.command("DELEX", key, "IFEQ", entry_id)


def plain_codes(
    replies: list[Any], name_keys: Sequence[str], retrying: bool
) -> tuple[list[int], list[int], dict[int, Exception]]:
    """The replies of a :func:`plain_done`: a :class:`DoneCode` per entry, the positions of the
    entries finished whose name key held something else than their id (for :func:`release`), and the
    ``DELEX`` refusals by position.

    ``XACKDEL``'s own error (NOGROUP, WRONGTYPE: nothing was acked) is raised. A ``DELEX`` refused (the
    name key is of another type, the ACL lacks ``+delex``) leaves that name alone, as ``done-n.lua``
    leaves a key of another type; the others go on.
    """
    acks = replies[0]
    if isinstance(acks, Exception):
        raise acks
    if not isinstance(acks, list) or len(acks) != len(name_keys):
        raise TypeError(f"XACKDEL replied {acks!r}, not one integer per entry")
    lost = int(DoneCode.ALREADY_DONE if retrying else DoneCode.LOCK_LOST)
    codes = [int(DoneCode.DONE) if a == 1 else lost for a in acks]
    held: list[int] = []
    refused: dict[int, Exception] = {}
    dels = iter(replies[1:])
    for i, key in enumerate(name_keys):
        if key:
            freed = next(dels, None)
            if isinstance(freed, Exception):
                refused[i] = freed
            # 0: the key held another value. After our ack that is "<id>+", someone waits:
            # release-1.lua hands the name on (it leaves any other value alone). A retry that finds
            # the entry already finished finds its name released by the call it retries.
            if freed == 0 and codes[i] == DoneCode.DONE:
                held.append(i)
    return codes, held, refused


def release(
    b: CommandBatch, stream: str, key_prefix: str, pairs: Sequence[tuple[str, str]]
) -> None:
    """``release-1.lua``: hand on the names of finished entries that registrations wait for; ``pairs``
    holds ``(DataStreamName, entry id)`` each. The reply counts the waiters put back."""
    args: list[str] = []
    for name, entry_id in pairs:
        args += (name, entry_id)
    b.command(
        "EVALSHA",
        RELEASE.sha,
        RELEASE.fixed_keys,
        stream,  # KEYS[1] the LBS
        key_prefix,  # ARGV[1] the service's key prefix
        *args,  # ARGV[2..] name, entry id, ...
    )


# ------------------------------------------------------------------ done-n ---
# Caller: lbs._consumer.finisher.


def done(
    b: CommandBatch,
    stream: str,
    lease_key: str,
    entry_ids: list[str],
    names: list[str],
    group: str,
    consumer: str,
    lease: str,
    key_prefix: str,
    xackdel: bool,
    retrying: bool,
    go_keys: list[str] | None = None,
) -> None:
    """Finish a batch held under ``lease``: KEYS the LBS and this consumer's lease; ARGV: group, the XACKDEL
    flag, the retry flag, the key prefix (names released; "": untouched), our consumer name, the lease
    value, the Go flag, the entry ids, the name holder keys of their DataStreamNames (``<key
    prefix>name:<name>``, written by the core; "" for an entry without a name), and beside a Go fleet
    each entry's Go-style lock key (``go_keys``; an entry a Go consumer took is ``DoneCode.TAKEN``). The
    reply is one digit per entry: :func:`done_codes` reads it."""
    head = (
        group,
        1 if xackdel else 0,
        1 if retrying else 0,
        key_prefix,
        consumer,
        lease,
        0 if go_keys is None else 1,
    )
    b.evalsha_locks(
        DONE.sha,
        (stream, lease_key),
        b"",
        entry_ids,
        head,
        tail=go_keys,
        names=names,
        name_prefix=f"{key_prefix}name:".encode() if key_prefix else b"",
        lock_keys=False,
    )


#: done-n.lua's digits ("0" .. "9") as the codes 0 .. 9.
_DIGITS = bytes.maketrans(b"0123456789", bytes(range(10)))


def done_codes(reply: bytes | str) -> list[int]:
    """``done-n.lua``'s reply, one digit per entry in the call's order, as a ``DoneCode`` value each."""
    raw = reply.encode() if isinstance(reply, str) else reply
    if not isinstance(raw, bytes) or (raw and not raw.isdigit()):
        raise TypeError(f"done-n replied {reply!r}, not one digit per entry")
    return list(raw.translate(_DIGITS))
