"""Fixtures of tests/cli (the helpers are in _cli_helpers.py; the servers in the root conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _cli_helpers import Proc, Procs, cli_env

# tests/integration's _helpers, for the test modules here (conftest runs before they import).
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """The file the handlers write to: one line per call."""
    path = tmp_path / "handled.log"
    path.touch()
    return path


@pytest.fixture
def start_worker(tmp_path: Path, log: Path) -> Iterator[Callable[..., Proc]]:
    """``start_worker(*args, **env)``: ``python -m lbs worker ARGS`` in the background; killed at teardown."""
    procs = Procs(tmp_path, cli_env(log), ("worker",))
    try:
        yield procs.start
    finally:
        procs.kill_all()
