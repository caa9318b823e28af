"""The keyed API's scripts: one builder per script and its result codes (see :mod:`lbs._redis.scripts`).

``publish-1`` is called by ``lbs.publisher`` (through redis-py: its ARGV from ``publish_args``),
``fetch-1`` and ``commit-1`` by ``lbs._consumer.keyed``; each script's header is the contract.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

from _lbscore import CommandBatch

from .sources import load
from .wire import sendable

__all__ = [
    "COMMIT",
    "FETCH",
    "PUBLISH",
    "CommitCode",
    "FetchCode",
    "KeyCommit",
    "commit",
    "fail_mode",
    "fetch",
    "publish",
    "publish_args",
]

PUBLISH = load("publish-1")
FETCH = load("fetch-1")
COMMIT = load("commit-1")


# --------------------------------------------------------------- publish-1 ---
# Caller: lbs.publisher.


def publish(
    b: CommandBatch, stream: str, prefix: str, messages: list[tuple[str, str, list[Any]]]
) -> None:
    """Append ``messages`` (``(key, registration or "", [field, value, ...])`` each) to their keys'
    data streams, registering the keys nobody has, in one call on the LBS ``stream``."""
    b.command(
        "EVALSHA",
        PUBLISH.sha,
        PUBLISH.fixed_keys,
        stream,  # KEYS[1] the LBS
        *publish_args(prefix, messages),
    )  # ARGV


def publish_args(prefix: str, messages: list[tuple[str, str, list[Any]]]) -> list[Any]:
    """ARGV of one call (KEYS[1]: the LBS): ``messages`` holds ``(key, registration or "", [field,
    value, ...])`` each."""
    args: list[Any] = [
        prefix,  # ARGV[1] the service's key prefix
        len(messages),
    ]  # ARGV[2] the message count
    for key, registration, fields in messages:
        args += (key, registration, len(fields), *fields)  # ARGV[3...] per message
    return args


# ----------------------------------------------------------------- fetch-1 ---
# Caller: lbs._consumer.keyed.


def fetch(
    b: CommandBatch,
    stream: str,
    prefix: str,
    lease_prefix: str,
    batch: int,
    group: str,
    keys: list[tuple[str, str, str]],
) -> None:
    """Become the holder of each ``(key, entry id, hold value)``; where each key stands."""
    args: list[Any] = [
        prefix,  # ARGV[1] the service's key prefix
        lease_prefix,  # ARGV[2] the lease key prefix
        batch,  # ARGV[3] the most messages a hold takes
        group,
    ]  # ARGV[4] the consumer group (a holder's entry's lease)
    for key in keys:
        args += key  # ARGV[5...] key, entry id, hold value "<token>:<consumer id>:<nonce>"
    b.command(
        "EVALSHA",
        FETCH.sha,
        FETCH.fixed_keys,
        stream,  # KEYS[1] the LBS
        *args,
    )


class FetchCode(enum.IntEnum):
    """The first element of each key's reply from ``fetch-1.lua``."""

    OURS = 1
    LOST = 2
    #: Another live holder has the key: this is a second registration.
    HELD_ELSEWHERE = 3
    WRONG_TYPE = 4


# ---------------------------------------------------------------- commit-1 ---
# Caller: lbs._consumer.keyed.


class KeyCommit(NamedTuple):
    """One key's part of a ``commit-1.lua`` call (see its header for the modes)."""

    key: str
    entry_id: str
    value: str
    #: The last message processed ("" for none).
    position: str
    mode: str
    #: The key's lbs-input value, for the modes that register it again ("" otherwise).
    registration: str | bytes = ""
    reason: str = ""
    traceback: str = ""
    #: ``(stream, (field, value, ...), ...)`` per effect (an :class:`lbs.keyed.Effect`), written with the commit.
    effects: Sequence[tuple[Any, ...]] = ()


def commit(
    b: CommandBatch,
    stream: str,
    prefix: str,
    lease_prefix: str,
    group: str,
    xackdel: bool,
    dead_letters: str,
    field_prefix: str,
    max_retries: int,
    consumer: str,
    keys: list[KeyCommit],
) -> None:
    """Commit each key's step, fenced, with its effects."""
    args: list[Any] = [
        prefix,  # ARGV[1] the service's key prefix
        lease_prefix,  # ARGV[2] the lease key prefix
        group,  # ARGV[3]
        1 if xackdel else 0,  # ARGV[4] XACKDEL or XACK + XDEL
        dead_letters,  # ARGV[5] the dead-letter stream
        field_prefix,  # ARGV[6] the managed-field prefix
        max_retries,  # ARGV[7] failed holds past 1 before a dead letter (-1: never)
        consumer,
    ]  # ARGV[8] recorded in dead letters
    for k in keys:  # ARGV[9...] 9 per key, then its effects
        args += (
            k.key,
            k.entry_id,
            k.value,
            k.position,
            k.mode,
            k.registration,
            sendable(k.reason),  # a handler's error text: a lone surrogate fails no batch
            sendable(k.traceback),
            len(k.effects),
        )
        for effect in k.effects:
            fields = effect[1]
            args += (effect[0], len(fields), *fields)
    b.command(
        "EVALSHA",
        COMMIT.sha,
        COMMIT.fixed_keys,
        stream,  # KEYS[1] the LBS
        *args,
    )


def fail_mode(delay_ms: int, blame: bool, last: str, count: int) -> str:
    """commit-1.lua's mode for a failed batch after the position (``last``: its last message;
    ``blame``: it held one message; ``count``: the messages to read when the call dead-letters)."""
    return f"fail:{delay_ms}:{1 if blame else 0}:{last}:{count}"


def fail_delay(mode: str) -> float:
    """The seconds a :func:`fail_mode` step parks its key for."""
    return int(mode.split(":", 2)[1]) / 1000


class CommitCode(enum.IntEnum):
    """The first element of each key's reply from ``commit-1.lua``."""

    MORE = 1
    NOT_OURS = 2
    RELEASED = 5
    #: Registered again (yielded, or parked after a failure): the hold is over.
    YIELDED = 6
    #: An effect cannot be written (its stream's type, the ACL): nothing written, still ours.
    EFFECT_REFUSED = 7
