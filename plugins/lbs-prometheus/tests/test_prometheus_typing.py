"""mypy --strict over the plugin (its own [tool.mypy] in plugins/lbs-prometheus/pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1]


def test_mypy_strict_passes_on_the_plugin() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "src/lbs_prometheus"],
        cwd=PLUGIN,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
