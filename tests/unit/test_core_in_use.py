"""The package runs on the compiled core, not on some Python stand-in."""

from __future__ import annotations

import importlib.machinery
import inspect

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
