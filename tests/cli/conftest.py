"""Fixtures of tests/cli (the helpers are in _cli_helpers.py; the servers in the root conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from _cli_helpers import ROOT, Proc, cli_env

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
    procs: list[Proc] = []

    def start(*args: str, **env: str) -> Proc:
        n = len(procs)
        out, err = tmp_path / f"worker{n}.out", tmp_path / f"worker{n}.err"
        with out.open("wb") as o, err.open("wb") as e:
            popen = subprocess.Popen(
                [sys.executable, "-m", "lbs", "worker", *args],
                cwd=ROOT,
                env=cli_env(log, **env),
                stdout=o,
                stderr=e,
            )
        proc = Proc(popen, out, err)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        children = proc.children() if proc.popen.poll() is None else set()
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(timeout=30)
        for (
            pid
        ) in children:  # a supervisor's, in their own session: they stop with it, but make sure
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
