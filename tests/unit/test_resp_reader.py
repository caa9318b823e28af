"""The core's RESP reader against hiredis (redis-py's parser when hiredis is
installed, as it is for lbs) and redis-py's stream-reply callbacks.

Three kinds of property: valid replies of every shape lbs reads come out as
hiredis builds them; stream entries read straight from the bytes equal what
the generic path (hiredis, then EntryParser) and redis-py + json.loads make
of the same bytes; and no byte string, random or cut short, does anything
but return replies, ask for more, or raise lbs.ProtocolError.
"""

from __future__ import annotations

import json
import math
from typing import Any

import hiredis
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from redis._parsers.helpers import parse_stream_list

import lbs
from _lbscore import NEED_MORE, EntryParser, ReplyError, RespReader, Shape

from _corehelpers import assert_drained
from _strategies import infos, names

# ------------------------------------------------------------ generic replies


class _Err:
    """An expected error reply."""

    def __init__(self, message: str) -> None:
        self.message = message


def _norm(value: Any) -> Any:
    """Comparable form: error replies as ("error", message), NaN-free floats kept."""
    if isinstance(value, BaseException):
        return ("error", str(value))
    if isinstance(value, _Err):
        return ("error", value.message)
    if isinstance(value, list):
        return [_norm(v) for v in value]
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    return value


def _bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


_line = st.binary(max_size=30).filter(lambda b: b"\r" not in b and b"\n" not in b)
_error_text = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\r\n"), max_size=30
)


def _double(f: float) -> tuple[bytes, float]:
    return b",%s\r\n" % repr(f).encode(), f


# (RESP bytes, the value hiredis and lbs must build): every type Redis sends
# lbs, in RESP2 and RESP3.
_leaves = st.one_of(
    st.binary(max_size=40).map(lambda b: (_bulk(b), b)),
    _line.map(lambda b: (b"+" + b + b"\r\n", b)),
    _error_text.map(lambda t: (b"-" + t.encode() + b"\r\n", _Err(t))),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: (b":%d\r\n" % i, i)),
    st.sampled_from(
        [
            (b"$-1\r\n", None),
            (b"*-1\r\n", None),
            (b"_\r\n", None),
            (b"#t\r\n", True),
            (b"#f\r\n", False),
        ]
    ),
    st.floats(allow_nan=False).map(_double),
)
_keys = st.one_of(
    st.binary(max_size=12).map(lambda b: (_bulk(b), b)),
    st.integers(-1000, 1000).map(lambda i: (b":%d\r\n" % i, i)),
)


def _aggregate(
    children: st.SearchStrategy[tuple[bytes, Any]],
) -> st.SearchStrategy[tuple[bytes, Any]]:
    def array(kind: bytes) -> st.SearchStrategy[tuple[bytes, Any]]:
        return st.lists(children, max_size=6).map(
            lambda items: (
                kind + b"%d\r\n" % len(items) + b"".join(e for e, _ in items),
                [v for _, v in items],
            )
        )

    def as_map(pairs: list[tuple[tuple[bytes, Any], tuple[bytes, Any]]]) -> tuple[bytes, Any]:
        return (
            b"%%%d\r\n" % len(pairs) + b"".join(k + v for (k, _), (v, _) in pairs),
            {k: v for (_, k), (_, v) in pairs},
        )

    maps = st.lists(st.tuples(_keys, children), max_size=5, unique_by=lambda kv: kv[0][1]).map(
        as_map
    )
    return st.one_of(array(b"*"), array(b"~"), array(b">"), maps)


replies = st.recursive(_leaves, _aggregate, max_leaves=25)


def _read_all(data: bytes, chunks: list[int] | None = None) -> list[Any]:
    reader = RespReader()
    out: list[Any] = []
    pieces = [data] if not chunks else _split(data, chunks)
    for piece in pieces:
        reader.feed(piece)
        while (reply := reader.gets()) is not NEED_MORE:
            out.append(reply)
    assert_drained(reader)
    return out


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)]) if b > a] or [data]


_HIREDIS_MORE = object()


def _hiredis_all(data: bytes) -> list[Any]:
    reader = hiredis.Reader(notEnoughData=_HIREDIS_MORE)
    reader.feed(data)
    out = []
    while (reply := reader.gets()) is not _HIREDIS_MORE:
        out.append(reply)
    return out


@given(st.lists(replies, min_size=1, max_size=4), st.lists(st.integers(0, 10**6), max_size=8))
def test_valid_replies_read_as_hiredis_reads_them(
    batch: list[tuple[bytes, Any]], cuts: list[int]
) -> None:
    data = b"".join(raw for raw, _ in batch)
    expected = [_norm(v) for _, v in batch]
    assert _norm(_read_all(data)) == expected
    assert _norm(_read_all(data, cuts)) == expected  # however the bytes arrive
    assert _norm(_hiredis_all(data)) == expected


@given(st.binary(min_size=3000, max_size=70000), st.lists(st.integers(0, 10**6), max_size=8))
def test_large_blob_strings_read_however_they_arrive(blob: bytes, cuts: list[int]) -> None:
    # Large values stand alone: inside the nested replies above they would
    # make hypothesis generate more data than it allows per example.
    data = b"*2\r\n" + _bulk(blob) + b":1\r\n"
    assert _read_all(data) == _read_all(data, cuts) == _hiredis_all(data) == [[blob, 1]]


@given(replies)
def test_a_reply_is_not_returned_before_its_last_byte(reply: tuple[bytes, Any]) -> None:
    raw = reply[0]
    reader = RespReader()
    for i in range(len(raw) - 1):
        reader.feed(raw[i : i + 1])
        assert reader.gets() is NEED_MORE
    reader.feed(raw[-1:])
    assert _norm(reader.gets()) == _norm(reply[1])


def test_any_contiguous_buffer_can_be_fed() -> None:
    # feed takes what memoryview(data).cast("B") takes: not only bytes. The
    # limited-API build (LBS_LIMITED_API=1) reads these without the buffer protocol.
    import array

    raw = b"*2\r\n$3\r\nabc\r\n:7\r\n"
    reader = RespReader()
    for piece in (
        bytearray(raw[:5]),
        memoryview(raw)[5:5],
        memoryview(raw)[5:12],
        array.array("B", raw[12:]),
    ):
        reader.feed(piece)
    assert reader.gets() == [b"abc", 7]
    wide = array.array("H")
    wide.frombytes(b"++\r\n")
    reader.feed(wide)  # any item format, read as its bytes
    assert reader.gets() == b"+"
    with pytest.raises(TypeError):
        reader.feed(memoryview(raw)[::2])  # not contiguous
    with pytest.raises(TypeError):
        reader.feed("*1\r\n")  # str has no buffer
    assert_drained(reader)


@pytest.mark.parametrize(
    "raw, value",
    [
        (
            b"(123456789012345678901234567890\r\n",
            123456789012345678901234567890,
        ),  # hiredis: the digits as bytes
        (b"=8\r\ntxt:abcd\r\n", b"abcd"),
        (b"|1\r\n+ttl\r\n:3\r\n:5\r\n", 5),  # an attribute annotates the value after it
        (b",inf\r\n", math.inf),
        (b",-inf\r\n", -math.inf),
        (b",1e500\r\n", math.inf),
        (b":-9223372036854775808\r\n", -(2**63)),
        (b"%1\r\n$1\r\nk\r\n*-1\r\n", {b"k": None}),
    ],
)
def test_resp3_types_hiredis_reads_differently(raw: bytes, value: Any) -> None:
    assert _read_all(raw) == [value]


@pytest.mark.parametrize("factory", [None, "Boom"])
def test_error_replies_are_values_of_the_given_type(factory: str | None) -> None:
    class Boom(Exception):
        pass

    reader = RespReader(Boom) if factory else RespReader()
    kind = Boom if factory else ReplyError  # the core's own, when no factory is given
    reader.feed(b"-ERR one\r\n!7\r\nERR two\r\n+OK\r\n")
    first, second, third = reader.gets(), reader.gets(), reader.gets()
    assert type(first) is kind and str(first) == "ERR one"
    assert type(second) is kind and str(second) == "ERR two"
    assert third == b"OK"


@pytest.mark.parametrize(
    "raw",
    [
        b"x\r\n",
        b":12a\r\n",
        b":\r\n",
        b":99999999999999999999\r\n",
        b"$-2\r\n",
        b"$3\r\nabcd\r\n",
        b"*-2\r\n",
        b"#x\r\n",
        b"_x\r\n",
        b",1.5x\r\n",
        b",\r\n",
        b"(12x\r\n",
        b"=2\r\nab\r\n",
        b"*1\r\n" * 65 + b":1\r\n",
    ],
)
def test_bytes_that_are_not_resp_raise_protocol_error(raw: bytes) -> None:
    reader = RespReader()
    reader.feed(raw)
    with pytest.raises(lbs.ProtocolError):
        reader.gets()
    with pytest.raises(lbs.ProtocolError):  # and the reader stays broken
        reader.gets()


def test_a_map_with_an_unhashable_key_is_a_protocol_error_and_the_next_reply_reads() -> None:
    reader = RespReader()
    reader.feed(b"%1\r\n*0\r\n:1\r\n+OK\r\n")
    with pytest.raises(lbs.ProtocolError, match="map key"):
        reader.gets()
    assert reader.gets() == b"OK"


def _drain(reader: RespReader, shape: int, parser: EntryParser) -> None:
    while True:
        got = reader.gets() if shape == Shape.ANY else reader.gets_entries(parser, shape)
        if got is NEED_MORE:
            return
        for m in got if shape == Shape.MESSAGES and type(got) is list else ():
            m.fields  # noqa: B018  (decoded lazily: must read too)


@given(
    st.binary(max_size=300),
    st.sampled_from([Shape.ANY, Shape.ENTRIES, Shape.SCRIPT_ENTRIES, Shape.XREAD, Shape.MESSAGES]),
)
def test_random_bytes_only_ever_raise_protocol_error(data: bytes, shape: int) -> None:
    reader = RespReader()
    reader.feed(data)
    try:
        _drain(reader, shape, EntryParser())
    except lbs.ProtocolError:
        pass


# ------------------------------------------------------------ stream entries


def _entry_ids() -> st.SearchStrategy[bytes]:
    return st.tuples(st.integers(0, 2**48), st.integers(0, 2**20)).map(lambda t: b"%d-%d" % t)


_json_docs = st.one_of(
    st.builds(lbs.encode_input, names, infos),
    st.builds(lambda n, i: json.dumps({"DataStreamName": n, "Info": i}).encode(), names, infos),
    st.builds(
        lambda n, x: json.dumps({"DataStreamName": n, "Info": x}, separators=(",", ":")).encode(),
        names,
        st.floats(allow_nan=False) | st.integers() | st.lists(st.integers(), max_size=3),
    ),
    st.builds(
        lambda n, f: (
            b'{"DataStreamName":"' + n.encode() + b'","Info":{"f":' + repr(f).encode() + b"}}"
        ),
        names,
        st.floats(allow_nan=False, allow_infinity=False),
    ),
)
_inputs = st.one_of(
    _json_docs,
    _json_docs.flatmap(
        lambda d: st.integers(0, len(d)).map(lambda i: d[:i] + d[i + 1 :])
    ),  # a byte dropped
    st.binary(max_size=40),
)
_counts = st.one_of(
    st.integers(0, 10**20).map(lambda i: str(i).encode()),
    st.sampled_from([b"-1", b" 3", b"+4", b"1_0", b"", b"x", b"\xff"]),
    st.binary(max_size=4),
)
_other = st.tuples(st.binary(max_size=12), st.binary(max_size=12))


@st.composite
def stream_entries(draw: st.DrawFn, claim: bool = False) -> tuple[bytes, list[Any]]:
    """One stream entry as RESP, and as hiredis would build it."""
    entry_id = draw(_entry_ids())
    if draw(st.integers(0, 15)) == 0:
        fields: list[bytes] | None = None  # deleted while pending
    else:
        pairs: list[tuple[bytes, bytes]] = []
        if draw(st.integers(0, 9)):
            pairs.append((b"lbs-input", draw(_inputs)))
        if draw(st.booleans()):
            pairs.append((b"_retry_count", draw(_counts)))
        if draw(st.booleans()):
            pairs.append((b"_original_id", draw(_entry_ids() | st.binary(max_size=6))))
        pairs += draw(st.lists(_other, max_size=2))
        if pairs and draw(st.integers(0, 5)) == 0:
            pairs.append(draw(st.sampled_from(pairs)))  # a repeated field: the last one wins
        pairs = draw(st.permutations(pairs))
        fields = [x for kv in pairs for x in kv]
    nil = draw(st.sampled_from([b"*-1\r\n", b"_\r\n", b"$-1\r\n"]))
    raw_fields = (
        nil if fields is None else b"*%d\r\n" % len(fields) + b"".join(_bulk(f) for f in fields)
    )
    if not claim:
        return b"*2\r\n" + _bulk(entry_id) + raw_fields, [entry_id, fields]
    idle, count = draw(st.integers(0, 10**9)), draw(st.integers(1, 100))
    as_text = draw(st.booleans())  # 8.4.0 sent them as strings
    meta = (
        _bulk(b"%d" % idle) + _bulk(b"%d" % count) if as_text else b":%d\r\n:%d\r\n" % (idle, count)
    )
    return (
        b"*4\r\n" + _bulk(entry_id) + raw_fields + meta,
        [entry_id, fields, b"%d" % idle if as_text else idle, b"%d" % count if as_text else count],
    )


def _attrs(e: Any) -> tuple[Any, ...]:
    return (
        e.id,
        e.stream,
        e.info,
        e.retry_count,
        e.original_id,
        e.error,
        e.fields,
        e.idle_ms,
        e.delivery_count,
    )


_entry_lists = st.booleans().flatmap(lambda claim: st.lists(stream_entries(claim), max_size=8))


@given(_entry_lists)
def test_entries_read_in_place_equal_the_generic_path(
    entries: list[tuple[bytes, list[Any]]],
) -> None:
    parser = EntryParser()
    raw = b"*%d\r\n" % len(entries) + b"".join(e for e, _ in entries)
    reader = RespReader()
    reader.feed(raw)
    direct = reader.gets_entries(parser, Shape.ENTRIES)
    generic = parser.parse_entries(_hiredis_all(raw)[0])
    assert [_attrs(e) for e in direct] == [_attrs(e) for e in generic]


def _message_model(entry: list[Any]) -> tuple[str, dict[str, str]]:
    """A keyed message as a handler must see it: id and fields decoded (invalid UTF-8 replaced), a
    field repeated: the last wins, a nil (deleted) entry: no fields."""
    entry_id, fields = entry[0], entry[1] or []
    fields = fields + [b""] * (len(fields) % 2)
    return entry_id.decode(), {
        fields[i].decode(errors="replace"): fields[i + 1].decode(errors="replace")
        for i in range(0, len(fields), 2)
    }


@given(_entry_lists, st.lists(st.integers(0, 10**6), max_size=6))
def test_messages_read_in_place_equal_the_model(
    entries: list[tuple[bytes, list[Any]]], cuts: list[int]
) -> None:
    raw = b"*%d\r\n" % len(entries) + b"".join(e for e, _ in entries) + b"-ERR after\r\n"
    reader = RespReader(ValueError)
    got: list[Any] = []
    for chunk in _split(raw, cuts):
        reader.feed(chunk)
        while (reply := reader.gets_entries(None, Shape.MESSAGES)) is not NEED_MORE:
            got.append(reply)
    messages, err = got
    assert [(m.id, m.fields) for m in messages] == [_message_model(model) for _, model in entries]
    assert isinstance(err, ValueError)  # a reply of another shape is read generically


def test_messages_of_an_unexpected_layout_are_a_protocol_error_and_the_next_reply_reads() -> None:
    reader = RespReader()
    reader.feed(b"*1\r\n:5\r\n*0\r\n")
    with pytest.raises(lbs.ProtocolError, match="not a stream message"):
        reader.gets_entries(None, Shape.MESSAGES)
    assert reader.gets_entries(None, Shape.MESSAGES) == []
    with pytest.raises(lbs.LbsError, match="needs an EntryParser"):
        reader.gets_entries(None, Shape.ENTRIES)


@pytest.mark.parametrize(
    "count, expected",
    [
        (b"0", 0),
        (b"7", 7),
        (b"-0", 0),
        (b"+4", 4),
        (b" 3", 3),
        (b"1_0", 10),
        (b"007", 7),
        (b"9223372036854775807", 2**63 - 1),
        (b"-1", None),
        (b"9223372036854775808", None),
        (b"", None),
        (b"x", None),
        (b"\xff", None),
    ],
)
def test_a_retry_count_is_what_int_makes_of_it_when_non_negative(
    count: bytes, expected: int | None
) -> None:
    fields = [b"lbs-input", lbs.encode_input("s"), b"_retry_count", count]
    raw = b"*1\r\n*2\r\n" + _bulk(b"1-0") + b"*4\r\n" + b"".join(_bulk(f) for f in fields)
    reader = RespReader()
    reader.feed(raw)
    (e,) = reader.gets_entries(EntryParser(), Shape.ENTRIES)
    if expected is None:
        assert e.error is not None and "_retry_count" in e.error
    else:
        assert (e.error, e.retry_count) == (None, expected)


@given(_entry_lists, st.booleans(), st.lists(st.integers(0, 10**6), max_size=6))
def test_xreadgroup_replies_equal_redis_py_plus_json(
    entries: list[tuple[bytes, list[Any]]], resp3: bool, cuts: list[int]
) -> None:
    parser = EntryParser()
    body = b"*%d\r\n" % len(entries) + b"".join(e for e, _ in entries)
    name = _bulk(b"svc-input")
    raw = (b"%1\r\n" + name + body) if resp3 else (b"*1\r\n*2\r\n" + name + body)
    reader = RespReader()
    got: Any = NEED_MORE
    for piece in _split(raw, cuts):
        assert got is NEED_MORE
        reader.feed(piece)
        got = reader.gets_entries(parser, Shape.XREAD)
    assert [e.id for e in got] == [x[0].decode() for _, x in entries]
    # redis-py's callback for the same entries, then json.loads where the
    # entry is a valid assignment.
    for e, (entry_id, fields) in zip(got, parse_stream_list([x[:2] for _, x in entries])):
        assert e.id == entry_id.decode()
        assert e.fields == (fields or {})
        if e.ok:
            doc = json.loads(fields[b"lbs-input"])
            assert (e.stream, e.info) == (doc["DataStreamName"], doc.get("Info") or {})


@given(st.lists(stream_entries(), max_size=5), st.lists(replies, max_size=2))
def test_script_reply_entries_come_first_the_rest_generic(
    entries: list[tuple[bytes, list[Any]]], rest: list[tuple[bytes, Any]]
) -> None:
    parser = EntryParser()
    raw = (
        b"*%d\r\n" % (1 + len(rest))
        + b"*%d\r\n" % len(entries)
        + b"".join(e for e, _ in entries)
        + b"".join(r for r, _ in rest)
    )
    reader = RespReader()
    reader.feed(raw)
    first, *others = reader.gets_entries(parser, Shape.SCRIPT_ENTRIES)
    assert [_attrs(e) for e in first] == [
        _attrs(e) for e in parser.parse_entries([x for _, x in entries])
    ]
    assert _norm(others) == [_norm(v) for _, v in rest]


def test_shaped_reads_of_other_replies_stay_generic() -> None:
    parser = EntryParser()
    reader = RespReader()
    reader.feed(b"-NOGROUP gone\r\n*-1\r\n_\r\n:5\r\n*1\r\n:1\r\n")
    err = reader.gets_entries(parser, Shape.XREAD)
    assert isinstance(err, Exception) and "NOGROUP" in str(err)
    assert reader.gets_entries(parser, Shape.XREAD) == []  # RESP2 nil: nothing new
    assert reader.gets_entries(parser, Shape.XREAD) == []  # RESP3 nil
    assert reader.gets_entries(parser, Shape.ENTRIES) == 5
    (odd,) = reader.gets_entries(parser, Shape.ENTRIES)
    assert odd.error is not None and odd.error.startswith("not a stream entry")


def test_a_big_reply_in_small_chunks_is_checked_once() -> None:
    # The check resumes where it stopped: feeding 1 MB in 1 KB pieces must
    # not re-walk the reply on every piece (this would take minutes if it did).
    payload = [b"x" * 100] * 10_000
    raw = b"*%d\r\n" % len(payload) + b"".join(_bulk(p) for p in payload)
    reader = RespReader()
    for i in range(0, len(raw), 1024):
        assert reader.gets() is NEED_MORE
        reader.feed(raw[i : i + 1024])
    assert reader.gets() == payload


@given(replies.flatmap(lambda r: st.integers(0, max(0, len(r[0]) - 1)).map(lambda i: r[0][:i])))
def test_truncated_replies_ask_for_more(prefix: bytes) -> None:
    assume(prefix)
    reader = RespReader()
    reader.feed(prefix)
    assert reader.gets() is NEED_MORE


def test_a_batch_says_which_replies_hold_entries() -> None:
    from _lbscore import CommandBatch

    b = CommandBatch()
    with pytest.raises(lbs.DataError):
        b.expect(Shape.ENTRIES)  # no command yet
    b.command("PING")
    b.command("XRANGE", "s", "-", "+")
    b.expect(Shape.ENTRIES)
    b.command("PING")
    assert b.expects_entries
    assert [b.reply_shape(i) for i in range(3)] == [Shape.ANY, Shape.ENTRIES, Shape.ANY]
    with pytest.raises(lbs.DataError):
        b.expect(99)
    b.clear()
    assert not b.expects_entries
