"""The lbs-input codec: the Go client's wire format, and bad input as data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lbs

from _strategies import infos, json_values, names


@given(names, infos)
def test_round_trip(name: str, info: dict[str, Any]) -> None:
    assert lbs.decode_input(lbs.encode_input(name, info)) == (name, info)


def test_encoding_is_the_go_clients_compact_json() -> None:
    # json.Marshal of the Go client's struct: compact, field order fixed.
    assert lbs.encode_input("session-1", {"k": "v"}) == b'{"DataStreamName":"session-1","Info":{"k":"v"}}'
    assert lbs.encode_input("s") == b'{"DataStreamName":"s","Info":{}}'
    assert lbs.encode_input("é") == '{"DataStreamName":"é","Info":{}}'.encode()


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b'{"DataStreamName":"a","Info":null}', ("a", {})),  # Go's nil map
        (b'{"DataStreamName":"a"}', ("a", {})),
        ('{"DataStreamName":"a","Info":{"x":[1,2]}}', ("a", {"x": [1, 2]})),
        (b'{"Info":{},"DataStreamName":"a","Extra":1}', ("a", {})),  # unknown fields ignored, like Go
    ],
)
def test_decode_accepts_what_go_sends(raw: bytes | str, expected: tuple[str, dict[str, Any]]) -> None:
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


@given(st.binary(max_size=200))
def test_random_bytes_never_raise_from_try_decode(raw: bytes) -> None:
    name, info, why = lbs.try_decode_input(raw)
    assert (why is None) == (name is not None)
    if why is None:
        assert json.loads(raw)["DataStreamName"] == name


@pytest.mark.parametrize(
    "name, info",
    [("", None), (None, None), (3, None), ("a", [1]), ("a", {"x": object()}), ("a", {"x": float("nan")})],
    ids=repr,
)
def test_encode_refuses_what_the_wire_cannot_carry(name: Any, info: Any) -> None:
    with pytest.raises(lbs.InvalidInputError):
        lbs.encode_input(name, info)


# The compiled decoder has a fast path for the canonical shape (our encoder's
# and Go's: no whitespace, DataStreamName first, a name without escapes) and a
# general path (json) for everything else. A str skips the fast path, so the
# same document as bytes and as str must decode identically, valid or not.
_docs = st.one_of(
    st.builds(lambda n, i: lbs.encode_input(n, i), names, infos),
    st.builds(lambda n, i, sep: json.dumps({"DataStreamName": n, "Info": i}, separators=sep).encode(),
              names, st.one_of(infos, json_values), st.sampled_from([(",", ":"), (", ", ": "), (",", ": ")])),
    st.builds(lambda n: b'{"DataStreamName":"' + n.encode() + b'"}', st.text(max_size=10)),
)


def _mutations(doc: bytes) -> st.SearchStrategy[bytes]:
    cut = st.integers(0, len(doc))
    return st.one_of(
        st.just(doc),
        cut.map(lambda i: doc[:i]),  # truncated
        st.tuples(cut, st.binary(min_size=1, max_size=3)).map(lambda t: doc[:t[0]] + t[1] + doc[t[0]:]),
        cut.map(lambda i: doc[:i] + doc[i + 1:]),  # a byte dropped
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


@pytest.mark.parametrize("raw", [
    b'{"DataStreamName":"s","Info":{}}',
    b'{"DataStreamName":"s","Info":null}',
    b'{"DataStreamName":"s"}',
    b'{"DataStreamName":"s","Info":{"a":[1,{"b":"}"}]}}',
    b'{"DataStreamName":"s\\u00e9","Info":{}}',  # an escape: the general path
    b'{"DataStreamName":"s","Info":{} }',  # whitespace: the general path
])
def test_canonical_and_near_canonical_documents_decode(raw: bytes) -> None:
    assert lbs.try_decode_input(raw) == (*lbs.decode_input(raw.decode()), None)


@pytest.mark.parametrize("number", [
    "0", "-0", "7", "-7", "999999999999999999", "-999999999999999999",  # 18 digits
    "9223372036854775807", "-9223372036854775808",  # the ends of int64
    "9223372036854775808", "-9223372036854775809", "1" + "0" * 40,  # beyond: Python ints all the same
    "01", "-", "1.", "1e", "-01", "1.5e-3", "2E+2",
])
def test_numbers_decode_as_json_decodes_them(number: str) -> None:
    raw = '{"DataStreamName":"s","Info":{"n":' + number + ',"l":[' + number + "]}}"
    try:
        expected = ("s", json.loads(raw)["Info"], None)
    except ValueError as exc:
        assert lbs.try_decode_input(raw.encode())[2] is not None, exc
        return
    assert lbs.try_decode_input(raw.encode()) == expected
    assert type(lbs.try_decode_input(raw.encode())[1]["n"]) is type(expected[1]["n"])  # type: ignore[index]
