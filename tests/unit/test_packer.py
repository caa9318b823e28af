"""The RESP encoder against redis-py's own (PythonRespSerializer), byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

import lbs

from _corehelpers import pack_command, pack_commands

_redis_py = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)


def redis_py_pack(*args: object) -> bytes:
    return b"".join(bytes(chunk) for chunk in _redis_py.pack(*args))


# Arguments of every kind redis-py accepts: bytes (empty and large included),
# str (any non-surrogate text), int (beyond 64 bits too) and float.
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=50)
args = st.one_of(
    st.binary(max_size=50),
    st.binary(min_size=6000, max_size=20000),
    text,
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
)
# The command name: redis-py splits it on spaces ("CONFIG GET"), so must we.
names = st.one_of(
    st.sampled_from(["SET", "XADD", "CONFIG GET", "xreadgroup"]), st.binary(min_size=1, max_size=12)
)


@given(name=names, rest=st.lists(args, max_size=8))
def test_pack_command_equals_redis_py(name: object, rest: list[object]) -> None:
    assert pack_command(name, *rest) == redis_py_pack(name, *rest)


@given(st.lists(st.tuples(names, st.lists(args, max_size=4)), max_size=6))
def test_pack_commands_is_the_concatenation(commands: list[tuple[object, list[object]]]) -> None:
    batch = [(name, *rest) for name, rest in commands]
    assert pack_commands(batch) == b"".join(redis_py_pack(*c) for c in batch)


def test_known_bytes() -> None:
    assert pack_command("SET", "k", 1) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"
    assert pack_command(b"GET", b"") == b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n"


@pytest.mark.parametrize("n", [0, 7, -1, 10**18, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 10**40])
def test_ints_are_their_decimal_digits_within_int64_and_beyond(n: int) -> None:
    assert pack_command("SET", "k", n) == redis_py_pack("SET", "k", n)


def test_buffer_types_are_sent_as_bytes() -> None:
    assert pack_command("SET", bytearray(b"ab"), memoryview(b"cd")) == redis_py_pack(
        "SET", b"ab", b"cd"
    )


@pytest.mark.parametrize("bad", [True, None, object(), [1], {"a": 1}], ids=repr)
def test_unencodable_argument_is_a_data_error(bad: object) -> None:
    with pytest.raises(lbs.DataError, match="Invalid input of type"):
        pack_command("SET", "k", bad)


def test_empty_command_is_a_data_error() -> None:
    with pytest.raises(lbs.DataError):
        pack_command()
    with pytest.raises(lbs.DataError):
        pack_commands([()])


def test_lone_surrogate_fails_like_str_encode() -> None:
    with pytest.raises(UnicodeEncodeError):
        pack_command("SET", "k", "\ud800")


ids = st.lists(st.one_of(text, st.binary(max_size=30)), max_size=20)


@given(
    head_keys=st.lists(args, max_size=3),
    prefix=st.binary(max_size=20),
    entry_ids=ids,
    head_args=st.lists(args, max_size=3),
    with_values=st.booleans(),
    append_ids=st.booleans(),
)
def test_command_batch_evalsha_locks_equals_redis_py(
    head_keys: list[object],
    prefix: bytes,
    entry_ids: list[object],
    head_args: list[object],
    with_values: bool,
    append_ids: bool,
) -> None:
    from _lbscore import CommandBatch

    values = [f"{i}:c" for i in range(len(entry_ids))] if with_values else None
    batch = CommandBatch()
    batch.evalsha_locks(
        "a" * 40,
        tuple(head_keys),
        prefix,
        entry_ids,
        tuple(head_args),  # type: ignore[arg-type]
        values,
        append_ids,
    )
    locks = [prefix + (i.encode() if isinstance(i, str) else i) for i in entry_ids]  # type: ignore[union-attr]
    expected = redis_py_pack(
        "EVALSHA",
        "a" * 40,
        len(head_keys) + len(entry_ids),
        *head_keys,
        *locks,
        *head_args,
        *(values or []),
        *(entry_ids if append_ids else []),
    )
    assert batch.getvalue() == expected
    assert len(batch) == 1


@given(st.lists(st.lists(args, min_size=1, max_size=5), max_size=5))
def test_command_batch_commands_equal_redis_py(commands: list[list[object]]) -> None:
    from _lbscore import CommandBatch

    batch = CommandBatch()
    for c in commands:
        batch.command("PING", *c)
    assert batch.getvalue() == b"".join(redis_py_pack("PING", *c) for c in commands)
    assert len(batch) == len(commands)
    batch.clear()
    assert (len(batch), batch.getvalue()) == (0, b"")


def test_command_batch_rejects_mismatched_values_and_bad_ids() -> None:
    from _lbscore import CommandBatch

    batch = CommandBatch()
    with pytest.raises(lbs.DataError):
        batch.evalsha_locks("sha", (), b"p:", ["1-0", "2-0"], (), ["only one"])
    with pytest.raises(lbs.DataError):
        batch.evalsha_locks("sha", (), b"p:", [12], ())
