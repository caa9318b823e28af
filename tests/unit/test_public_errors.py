"""Bad arguments to lbs's public functions raise LbsError subclasses, never a bare Python error."""

from __future__ import annotations

from typing import Any

import pytest

import lbs


@pytest.mark.parametrize("name, info, says", [
    ("\ud800", None, "lone surrogate"),
    ("ok", {"k": "\udc00"}, "lone surrogate"),
    (5, None, "must be a str"),
    ("", None, "non-empty"),
])
def test_encode_input_refuses_with_invalid_input_error(name: Any, info: Any, says: str) -> None:
    with pytest.raises(lbs.InvalidInputError, match=says):
        lbs.encode_input(name, info)


def test_encode_input_refuses_info_nested_too_deep() -> None:
    deep: dict[str, Any] = {}
    for _ in range(5000):
        deep = {"d": deep}
    with pytest.raises(lbs.InvalidInputError, match="nested too deeply"):
        lbs.encode_input("s", deep)


def test_encode_input_writes_the_go_clients_compact_form() -> None:
    assert lbs.encode_input("s", {"u": 1}) == b'{"DataStreamName":"s","Info":{"u":1}}'


@pytest.mark.parametrize("name", ["\ud800", 5])
def test_shard_of_refuses_what_cannot_be_a_name(name: Any) -> None:
    with pytest.raises(lbs.InvalidInputError):
        lbs.shard_of(name, 2)
