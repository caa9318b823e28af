"""What the tests need of the compiled core beyond what lbs uses, built on its public methods
(the core ships no test-only methods)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from _lbscore import CommandBatch, HeldTable, RespReader


def pack_command(*args: object) -> bytes:
    """One command, encoded as ``CommandBatch.command`` writes it."""
    b = CommandBatch(256)
    b.command(*args)
    return b.getvalue()


def pack_commands(commands: Iterable[Sequence[object]]) -> bytes:
    """Commands encoded one after the other into one batch."""
    b = CommandBatch()
    for c in commands:
        b.command(*c)
    return b.getvalue()


def held_streams(t: HeldTable) -> int:
    """How many distinct stream names ``t`` holds."""
    return len({h.stream for h in t.values()})


def assert_drained(reader: RespReader) -> None:
    """``reader`` keeps no unread bytes: a reply fed now is read as itself, and nothing follows.

    (Any bytes left over would be the start of a reply that swallows or
    mangles the probe.) Leaves the reader empty."""
    reader.feed(b"+lbs-probe\r\n")
    assert reader.gets() == b"lbs-probe"
    reader.feed(b":1\r\n")
    assert reader.gets() == 1
