"""Every hook has the contract in its docstring and the lbs_ prefix."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pluggy

from lbs import hookspecs
from lbs.plugins import make_plugin_manager


def _specs() -> list[tuple[str, Callable[..., Any]]]:
    return [
        (n, f) for n, f in inspect.getmembers(hookspecs, inspect.isfunction) if n.startswith("lbs_")
    ]


def test_every_hook_is_documented_and_exported() -> None:
    specs = _specs()
    assert specs
    for name, fn in specs:
        doc = inspect.getdoc(fn) or ""
        assert "Called" in doc, f"{name} must say when it is called"
        assert "versionadded" in doc, name
        assert name in hookspecs.__all__


def test_every_argument_has_a_param_line() -> None:
    for name, fn in _specs():
        doc = inspect.getdoc(fn) or ""
        for param in inspect.signature(fn).parameters:
            assert f":param {param}:" in doc, f"{name}'s docstring has no ':param {param}:'"


def test_plugin_manager_checks_hook_names() -> None:
    class Typo:
        @hookspecs.hookimpl
        def lbs_lock_aquired(self) -> None:  # misspelt on purpose
            pass

    try:
        make_plugin_manager([Typo()], load_entrypoints=False)
    except pluggy.PluginValidationError as exc:
        assert "lbs_lock_aquired" in str(exc)
    else:
        raise AssertionError("a misspelt hook must be refused")
