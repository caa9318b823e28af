"""The lbs-input codec: the Go client's wire format, and bad input as data."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lbs
from _lbscore import EntryParser

from _strategies import infos, json_values, names


@given(names, infos)
def test_round_trip(name: str, info: dict[str, Any]) -> None:
    assert lbs.decode_input(lbs.encode_input(name, info)) == (name, info)


def test_encoding_is_the_go_clients_compact_json() -> None:
    # json.Marshal of the Go client's struct: compact, field order fixed.
    assert (
        lbs.encode_input("session-1", {"k": "v"})
        == b'{"DataStreamName":"session-1","Info":{"k":"v"}}'
    )
    assert lbs.encode_input("s") == b'{"DataStreamName":"s","Info":{}}'
    assert lbs.encode_input("é") == '{"DataStreamName":"é","Info":{}}'.encode()


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b'{"DataStreamName":"a","Info":null}', ("a", {})),  # Go's nil map
        (b'{"DataStreamName":"a"}', ("a", {})),
        ('{"DataStreamName":"a","Info":{"x":[1,2]}}', ("a", {"x": [1, 2]})),
        (
            b'{"Info":{},"DataStreamName":"a","Extra":1}',
            ("a", {}),
        ),  # unknown fields ignored, like Go
    ],
)
def test_decode_accepts_what_go_sends(
    raw: bytes | str, expected: tuple[str, dict[str, Any]]
) -> None:
    assert lbs.decode_input(raw) == expected


@pytest.mark.parametrize(
    "raw, reason",
    [
        (None, "no lbs-input field"),
        (b"", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1,2]", "not a JSON object"),
        (b'{"DataStreamName":""}', "DataStreamName"),
        (b'{"DataStreamName":7}', "DataStreamName"),
        (b'{"DataStreamName":"a","Info":[1]}', "Info is not a JSON object"),
        (12, "unexpected type"),
    ],
)
def test_bad_input_gives_a_reason(raw: object, reason: str) -> None:
    name, info, why = lbs.try_decode_input(raw)  # type: ignore[arg-type]
    assert name is None and info is None
    assert why is not None and reason in why
    with pytest.raises(lbs.InvalidInputError, match=reason):
        lbs.decode_input(raw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw, reason",
    [
        # A lone surrogate escape, as a foreign producer writes it: json.loads makes a str of it
        # that UTF-8 cannot encode, so no key or script argument could carry it.
        (
            rb'{"DataStreamName":"bad\ud800name"}',
            r"DataStreamName 'bad\ud800name' contains '\ud800' at position 3",
        ),
        (rb'{"DataStreamName": "x\udc00"}', r"contains '\udc00' at position 1"),
        (rb'{"DataStreamName":"x\ud800\u0041"}', r"'x\ud800A' contains '\ud800'"),
        (rb'{"DataStreamName":"x\ud800\\udc00"}', r"contains '\ud800'"),  # \\ is a backslash
        (rb'{"DataStreamName":"x\uDBFF"}', r"contains '\udbff'"),
        (
            rb'{"DataStreamName":"x","Info":{"k":["\udfff"]}}',
            r"escape \udfff at byte 36 (in its Info",
        ),
        (rb'{"Info":{"\ud800":1},"DataStreamName":"x"}', r"escape \ud800 at byte 10"),
        (rb'{"DataStreamName":"x","Other":"\ud800"}', r"escape \ud800"),
        # A str holding the character itself (a parser that decoded with surrogates).
        ('{"DataStreamName":"x\ud800"}', r"not UTF-8: it contains '\ud800' at position 20"),
    ],
)
def test_a_lone_surrogate_anywhere_is_malformed(raw: bytes | str, reason: str) -> None:
    name, info, why = lbs.try_decode_input(raw)
    assert (name, info) == (None, None)
    assert why is not None and "lone surrogate" in why and "UTF-8 cannot encode" in why
    assert reason in why, why
    with pytest.raises(lbs.InvalidInputError, match=re.escape(reason)):
        lbs.decode_input(raw)
    # The reader's judge says the same, for bytes or for a str another parser made.
    for value in (raw, raw.decode() if isinstance(raw, bytes) else raw):
        [entry] = EntryParser().parse_entries([[b"1-0", [b"lbs-input", value]]])
        assert entry.stream is None and entry.error is not None
        assert "lone surrogate" in entry.error or "not UTF-8" in entry.error, entry.error


@pytest.mark.parametrize(
    "raw, name",
    [
        (rb'{"DataStreamName":"x\ud83d\ude00"}', "x\U0001f600"),  # a pair: one character
        (rb'{"DataStreamName":"x\uD83D\uDE00y"}', "x\U0001f600y"),
        (rb'{"DataStreamName":"x\udbff\udfff"}', "x\U0010ffff"),
        (rb'{"DataStreamName":"x\\ud800"}', r"x\ud800"),  # an escaped backslash, then text
        (rb'{"DataStreamName":"x\u0000\n\u2028\uffff"}', "x\x00\n\u2028\uffff"),
        (rb'{"DataStreamName":"x","Info":{"a\"\\":"\ud83d\ude00"}}', "x"),
    ],
)
def test_surrogate_pairs_and_odd_characters_are_names_like_any(raw: bytes, name: str) -> None:
    got, _info, why = lbs.try_decode_input(raw)
    assert why is None and got == name


_with_surrogates = st.text(
    st.one_of(st.characters(categories=["Cs"]), st.sampled_from("a\U0001f600")), max_size=6
)


@given(_with_surrogates, _with_surrogates)
def test_what_is_accepted_utf8_encodes_and_only_that_is(name: str, value: str) -> None:
    # json.dumps escapes every surrogate: a high one right before a low one reads back as one
    # character, any other stays lone in what json.loads gives.
    raw = json.dumps({"DataStreamName": "n" + name, "Info": {"k" + value: value}}).encode()
    doc = json.loads(raw)
    encodable = all(_encodes(x) for x in (doc["DataStreamName"], *doc["Info"].popitem()))
    got, info, why = lbs.try_decode_input(raw)
    assert (why is None) == encodable, why
    if why is None:
        assert got is not None and info is not None
        _ = (got.encode(), json.dumps(info, ensure_ascii=False).encode())
    else:
        assert "lone surrogate" in why


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@given(st.binary(max_size=200))
def test_random_bytes_never_raise_from_try_decode(raw: bytes) -> None:
    name, _info, why = lbs.try_decode_input(raw)
    assert (why is None) == (name is not None)
    if why is None:
        assert json.loads(raw)["DataStreamName"] == name


@pytest.mark.parametrize(
    "name, info",
    [
        ("", None),
        (None, None),
        (3, None),
        ("a", [1]),
        ("a", {"x": object()}),
        ("a", {"x": float("nan")}),
    ],
    ids=repr,
)
def test_encode_refuses_what_the_wire_cannot_carry(name: Any, info: Any) -> None:
    with pytest.raises(lbs.InvalidInputError):
        lbs.encode_input(name, info)


# The compiled decoder has a fast path for the canonical shape (our encoder's
# and Go's: DataStreamName first, a name without escapes), with any JSON
# whitespace between the tokens (json.dumps's default separators, an indent),
# and a general path (json) for everything else. A str skips the fast path,
# so the same document as bytes and as str must decode identically, valid or
# not.

#: json.dumps settings a producer may use. The compact form is ours and Go's;
#: the default separators (", " and ": ") are a plain json.dumps(doc)'s.
_LAYOUTS: list[dict[str, Any]] = [
    {},
    {"separators": (",", ":"), "ensure_ascii": False},
    {"ensure_ascii": False},
    {"indent": 2},
    {"indent": "\t", "ensure_ascii": False},
    {"indent": 0},
    {"indent": "\r\n ", "separators": (" ,", " : ")},
]
_ws = st.text(alphabet=" \t\r\n", max_size=3)  # RFC 8259's whitespace


def _spaced(value: Any, ws: Callable[[], str], ensure_ascii: bool) -> str:
    """``value`` as JSON with ``ws()`` wherever JSON allows whitespace: around
    every structural character."""
    if isinstance(value, dict):
        members = [
            f"{ws()}{json.dumps(k, ensure_ascii=ensure_ascii)}{ws()}:{ws()}{_spaced(v, ws, ensure_ascii)}{ws()}"
            for k, v in value.items()
        ]
        return "{" + (",".join(members) or ws()) + "}"
    if isinstance(value, list):
        return (
            "["
            + (",".join(f"{ws()}{_spaced(v, ws, ensure_ascii)}{ws()}" for v in value) or ws())
            + "]"
        )
    return json.dumps(value, ensure_ascii=ensure_ascii)


_documents = st.one_of(
    st.builds(lambda n, i: {"DataStreamName": n, "Info": i}, names, st.one_of(infos, json_values)),
    st.builds(lambda n: {"DataStreamName": n}, names),
)


@st.composite
def _spaced_docs(draw: st.DrawFn) -> bytes:
    doc, ensure_ascii = draw(_documents), draw(st.booleans())
    return (draw(_ws) + _spaced(doc, lambda: draw(_ws), ensure_ascii) + draw(_ws)).encode()


_docs = st.one_of(
    st.builds(lbs.encode_input, names, infos),
    st.builds(lambda d, kw: json.dumps(d, **kw).encode(), _documents, st.sampled_from(_LAYOUTS)),
    _spaced_docs(),
    st.builds(lambda n: b'{"DataStreamName":"' + n.encode() + b'"}', st.text(max_size=10)),
)


def _mutations(doc: bytes) -> st.SearchStrategy[bytes]:
    cut = st.integers(0, len(doc))
    return st.one_of(
        st.just(doc),
        cut.map(lambda i: doc[:i]),  # truncated
        st.tuples(cut, st.binary(min_size=1, max_size=3)).map(
            lambda t: doc[: t[0]] + t[1] + doc[t[0] :]
        ),
        cut.map(lambda i: doc[:i] + doc[i + 1 :]),  # a byte dropped
    )


@given(_docs.flatmap(_mutations))
def test_fast_and_general_paths_agree(raw: bytes) -> None:
    as_bytes = lbs.try_decode_input(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert as_bytes[2] is not None and as_bytes[:2] == (None, None)
        return
    as_text = lbs.try_decode_input(text)
    assert as_bytes == as_text


@pytest.mark.parametrize(
    "raw",
    [
        b'{"DataStreamName":"s","Info":{}}',
        b'{"DataStreamName":"s","Info":null}',
        b'{"DataStreamName":"s"}',
        b'{"DataStreamName":"s","Info":{"a":[1,{"b":"}"}]}}',
        b'{"DataStreamName":"s\\u00e9","Info":{}}',  # an escape: the general path
        b'{"DataStreamName":"s","Info":{} }',
        b' \t\r\n{ "DataStreamName" : "s" , "Info" : null }\n',
        b'{"DataStreamName": "s t", "Info": {"a \\" b": [ ], "c": { }, "d": [1, 2.5, true, false, null]}}',
    ],
)
def test_canonical_and_near_canonical_documents_decode(raw: bytes) -> None:
    assert lbs.try_decode_input(raw) == (*lbs.decode_input(raw.decode()), None)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"DataStreamName":"s","Info":{"n":1 2}}',  # whitespace between two values
        b'{"DataStreamName":"s","Info":{"n":tr ue}}',  # or inside one
        b'{"DataStreamName":"s","Info":{"n":- 1}}',
        b'{"DataStreamName":"s","Info":{"n":"a" "b"}}',
        b'{"DataStreamName" "s"}',
        b'{"DataStreamName":"s","Info":nu ll}',
        b'{"DataStreamName":"s",\x0c"Info":{}}',  # a form feed is not JSON whitespace
        b'{"DataStreamName":"s",\x0b"Info":{}}',  # nor a vertical tab
        b'{"DataStreamName":"s",\xc2\xa0"Info":{}}',  # nor a no-break space
        b'{"DataStreamName":"s","Info":{"n":1,\t}}',
        b'{"DataStreamName":"s"} x',
        b" ",
    ],
)
def test_whitespace_where_json_allows_none_is_refused_alike(raw: bytes) -> None:
    name, info, why = lbs.try_decode_input(raw)
    assert (name, info) == (None, None) and why is not None
    assert lbs.try_decode_input(raw.decode()) == (None, None, why)


def _by_json(raw: bytes) -> tuple[str, dict[str, Any]] | None:
    """What json.loads makes of ``raw`` by the wire format's rules; None: refused."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    name, info = doc.get("DataStreamName"), doc.get("Info")
    if not isinstance(name, str) or not name or not isinstance(info, (dict, type(None))):
        return None
    return name, info or {}


@given(
    st.one_of(
        st.builds(
            lambda d, kw: json.dumps(d, **kw).encode(), _documents, st.sampled_from(_LAYOUTS)
        ),
        _spaced_docs(),
    )
)
def test_json_dumps_output_decodes_as_json_loads_reads_it(raw: bytes) -> None:
    expected = _by_json(raw)
    got = lbs.try_decode_input(raw)
    if expected is None:
        assert got[:2] == (None, None) and got[2]
    else:
        # repr too: 1 == 1.0 and 0.0 == -0.0, but a decoder must not turn one into the other.
        assert got == (*expected, None) and repr(got) == repr((*expected, None))
    # The same answer, reason included, from the general path (a str) and
    # from the reader's (the bytes in its buffer).
    assert lbs.try_decode_input(raw.decode()) == got
    [entry] = EntryParser().parse_entries([[b"1-0", [b"lbs-input", raw]]])
    assert (entry.stream, entry.info, entry.error) == got


@pytest.mark.parametrize("layout", _LAYOUTS, ids=repr)
def test_json_dumps_layouts_take_the_fast_path(layout: dict[str, Any]) -> None:
    # The fast path hands out one str object per object key, from its key
    # cache; json.loads makes new ones for every document. So the same key
    # object from two decodes means the fast path read both.
    keys = []
    for n in range(2):
        raw = json.dumps(
            {"DataStreamName": f"s{n}", "Info": {"shard": n, "tags": [1, {}]}}, **layout
        ).encode()
        name, info = lbs.decode_input(raw)
        assert (name, info) == (f"s{n}", {"shard": n, "tags": [1, {}]})
        keys.append(next(iter(info)))
    assert keys[0] is keys[1]


@pytest.mark.parametrize(
    "number",
    [
        "0",
        "-0",
        "7",
        "-7",
        "999999999999999999",
        "-999999999999999999",  # 18 digits
        "9223372036854775807",
        "-9223372036854775808",  # the ends of int64
        "9223372036854775808",
        "-9223372036854775809",
        "1" + "0" * 40,  # beyond: Python ints all the same
        "01",
        "-",
        "1.",
        "1e",
        "-01",
        "1.5e-3",
        "2E+2",
        # int() refuses more digits than sys.get_int_max_str_digits() (4300 by default, never below 640)
        *(
            pytest.param(sign + "1" * n, id=f"{sign}1 x {n}")
            for sign in ("", "-")
            for n in (640, 641, 4300, 4301)
        ),
    ],
)
def test_numbers_decode_as_json_decodes_them(number: str) -> None:
    raw = '{"DataStreamName":"s","Info":{"n":' + number + ',"l":[' + number + "]}}"
    try:
        expected = ("s", json.loads(raw)["Info"], None)
    except ValueError as exc:
        assert lbs.try_decode_input(raw.encode())[2] is not None, exc
        return
    assert lbs.try_decode_input(raw.encode()) == expected
    assert type(lbs.try_decode_input(raw.encode())[1]["n"]) is type(expected[1]["n"])  # type: ignore[index]
