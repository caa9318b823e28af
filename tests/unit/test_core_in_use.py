"""The package runs on the compiled core, not on some Python stand-in."""

from __future__ import annotations

import importlib.machinery
import inspect
import subprocess
import sys

import pytest

import _lbscore
import _lbscore._core as core
import lbs
import lbs.producer


def test_core_is_an_extension_module() -> None:
    assert core.__file__ is not None
    assert core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert isinstance(core.__loader__, importlib.machinery.ExtensionFileLoader)


def test_public_names_are_the_compiled_functions() -> None:
    for name in ("decode_input", "try_decode_input"):
        fn = getattr(lbs, name)
        assert fn is getattr(core, name) is getattr(_lbscore, name)
        assert not inspect.isfunction(fn), f"{name} is a Python function, not compiled code"
    # lbs.encode_input only turns the core's Python errors (a lone surrogate, deep
    # nesting) into InvalidInputError; the producer's batches call the core directly.
    assert lbs.encode_input is lbs.producer.encode_input
    assert lbs.producer._core_encode is core.encode_input is _lbscore.encode_input


def test_release_build_has_debug_checks_off() -> None:
    # `make setup` builds without LBS_DEBUG; a debug build would say True.
    assert core.DEBUG_BUILD is False


def test_lbs_hands_its_error_types_to_the_core() -> None:
    with pytest.raises(lbs.InvalidInputError):
        core.decode_input(b"not json")
    with pytest.raises(lbs.DataError):
        core.CommandBatch().command("SET", "k", True)
    reader = core.RespReader()
    reader.feed(b"?\r\n")
    with pytest.raises(lbs.ProtocolError):
        reader.gets()
    with pytest.raises(TypeError, match="exception classes"):
        core.use_errors(
            data_error=lbs.DataError,
            invalid_input=lbs.InvalidInputError,
            internal_error="InternalError",
            protocol_error=lbs.ProtocolError,
        )  # type: ignore[arg-type]


_CORE_ALONE = """
import sys
import _lbscore

def imported():
    return sorted(m for m in sys.modules if m in ("lbs", "redis") or m.startswith(("lbs.", "redis.")))

def raised(fn):
    try:
        fn()
    except Exception as exc:
        return type(exc)

assert imported() == [], imported()
assert raised(lambda: _lbscore.decode_input(b"x")) is ValueError
reader = _lbscore.RespReader()
reader.feed(b"-ERR x\\r\\n?\\r\\n")
assert type(reader.gets()) is _lbscore.ReplyError
assert raised(reader.gets) is RuntimeError
assert imported() == [], imported()
"""


def test_the_core_alone_imports_neither_lbs_nor_redis() -> None:
    # Until lbs hands its types in, the core raises built-in ones.
    proc = subprocess.run(
        [sys.executable, "-c", _CORE_ALONE], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
