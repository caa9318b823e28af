"""EntryColumns: XRANGE / XREADGROUP replies read into Arrow-ready buffers, checked against the entries."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _lbscore import NEED_MORE, EntryColumns, RespReader, Shape
from lbs.exceptions import DataError

from _corehelpers import assert_drained


def bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def entries_reply(entries: list[tuple[bytes, list[bytes] | None]]) -> bytes:
    out = b"*%d\r\n" % len(entries)
    for entry_id, flat in entries:
        out += (
            b"*2\r\n"
            + bulk(entry_id)
            + (
                b"*-1\r\n"
                if flat is None
                else b"*%d\r\n" % len(flat) + b"".join(bulk(x) for x in flat)
            )
        )
    return out


def unpack(taken: tuple[Any, ...]) -> list[tuple[bytes, list[tuple[bytes, bytes]]]]:
    rows, pairs, ids, id_off, keys, key_off, values, value_off, map_off = taken

    def offsets(raw: bytes, n: int) -> list[int]:
        assert len(raw) == 4 * (n + 1)
        return list(struct.unpack(f"<{n + 1}i", raw))

    io, ko, vo, mo = (
        offsets(id_off, rows),
        offsets(key_off, pairs),
        offsets(value_off, pairs),
        offsets(map_off, rows),
    )
    out = []
    for r in range(rows):
        kv = [(keys[ko[j] : ko[j + 1]], values[vo[j] : vo[j + 1]]) for j in range(mo[r], mo[r + 1])]
        out.append((ids[io[r] : io[r + 1]], kv))
    return out


entry = st.tuples(
    st.tuples(st.integers(0, 10**13), st.integers(0, 10)),
    st.one_of(
        st.none(), st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=6)), max_size=3)
    ),
)


@given(
    st.lists(entry, max_size=12, unique_by=lambda e: e[0]),
    st.one_of(st.none(), st.integers(0, 10**13)),
    st.integers(1, 7),
    st.booleans(),
)
def test_entries_up_to_the_bound_arrive_whole_however_the_bytes_are_split(
    raw: list[Any], bound: int | None, step: int, xread: bool
) -> None:
    raw.sort()
    entries = [
        (b"%d-%d" % ident, None if kv is None else [x for pair in kv for x in pair])
        for ident, kv in raw
    ]
    data = entries_reply(entries)
    if xread:
        data = b"*1\r\n*2\r\n" + bulk(b"s") + data
    cols, reader = EntryColumns(), RespReader()
    cols.bound(None if bound is None else f"{bound}-5")
    seen: object = NEED_MORE
    for i in range(0, len(data), step):
        assert seen is NEED_MORE
        reader.feed(data[i : i + step])
        seen = cols.read(reader, Shape.XREAD if xread else Shape.ENTRIES)
    assert seen == len(entries)
    assert_drained(reader)
    kept = [
        (ident, kv)
        for ident, kv in raw
        if kv is not None and (bound is None or ident <= (bound, 5))
    ]
    assert unpack(cols.take()) == [(b"%d-%d" % ident, kv) for ident, kv in kept]
    assert cols.passed == (bound is not None and any(ident > (bound, 5) for ident, _ in raw))
    assert cols.last_id == (entries[-1][0] if entries else None)
    assert unpack(cols.take()) == []  # taken: empty again


def test_an_error_reply_is_raised_and_a_nil_reply_is_empty() -> None:
    cols, reader = EntryColumns(), RespReader()
    reader.feed(b"-NOGROUP no such group\r\n*-1\r\n")
    with pytest.raises(Exception, match="NOGROUP"):
        cols.read(reader, Shape.XREAD)
    assert cols.read(reader, Shape.XREAD) == 0 and len(cols) == 0


def test_a_reply_that_is_not_entries_is_a_clear_error() -> None:
    cols, reader = EntryColumns(), RespReader()
    reader.feed(b":12\r\n")
    with pytest.raises(DataError, match="not a stream entries reply"):
        cols.read(reader, Shape.ENTRIES)
    with pytest.raises(DataError, match="not a stream entry id"):
        cols.bound("yesterday")
