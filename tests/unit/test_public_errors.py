"""Bad arguments to lbs's public functions raise LbsError subclasses, never a bare Python error."""

from __future__ import annotations

from typing import Any

import pytest

import lbs
from _lbscore import try_decode_input


@pytest.mark.parametrize(
    "name, info, says",
    [
        ("\ud800", None, "lone surrogate"),
        ("ok", {"k": "\udc00"}, "lone surrogate"),
        (5, None, "must be a str"),
        ("", None, "non-empty"),
    ],
)
def test_encode_input_refuses_with_invalid_input_error(name: Any, info: Any, says: str) -> None:
    with pytest.raises(lbs.InvalidInputError, match=says):
        lbs.encode_input(name, info)


def test_encode_input_refuses_info_nested_too_deep() -> None:
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"d": deep}
    with pytest.raises(lbs.InvalidInputError, match="nested too deeply"):
        lbs.encode_input("s", deep)


def _nested(levels: int) -> dict[str, Any]:
    deep: dict[str, Any] = {}
    for _ in range(levels):
        deep = {"d": deep}
    return deep


def test_the_nesting_limit_is_the_same_on_every_python() -> None:
    """512 levels of JSON, the document's own object counted, whatever json's own limit (Python's
    recursion limit on 3.10-3.12, none on 3.13): what one producer writes, every consumer reads."""
    raw = lbs.encode_input("s", _nested(510))  # + the Info object + the document = 512
    assert lbs.decode_input(raw) == ("s", _nested(510))
    with pytest.raises(lbs.InvalidInputError, match="nested too deeply"):
        lbs.encode_input("s", _nested(511))
    deeper = raw.replace(b'"Info":', b'"Info":{"d":', 1) + b"}"
    name, info, reason = try_decode_input(deeper)
    assert (name, info) == (None, None) and "nested too deeply" in str(reason)


def test_encode_input_writes_the_go_clients_compact_form() -> None:
    assert lbs.encode_input("s", {"u": 1}) == b'{"DataStreamName":"s","Info":{"u":1}}'


@pytest.mark.parametrize("name", ["\ud800", 5])
def test_shard_of_refuses_what_cannot_be_a_name(name: Any) -> None:
    with pytest.raises(lbs.InvalidInputError):
        lbs.shard_of(name, 2)
