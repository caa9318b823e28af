"""The repository's pyproject.toml files, parsed (nothing built): shared by the packaging tests."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def load(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


ROOT_PYPROJECT = load(ROOT / "pyproject.toml")
#: plugin directory name -> its parsed pyproject.toml
PLUGINS = {p.parent.name: load(p) for p in sorted(ROOT.glob("plugins/*/pyproject.toml"))}


def python_classifiers(project: dict[str, Any]) -> list[tuple[int, int]]:
    """The CPython versions a [project] table lists as classifiers, e.g. [(3, 10), (3, 11)]."""
    found = (
        re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", c)
        for c in project["classifiers"]
    )
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def python_floor(project: dict[str, Any]) -> tuple[int, int]:
    """The version in ``requires-python = ">=3.X"`` (the only form the projects use)."""
    m = re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"].replace(" ", ""))
    assert m, f"requires-python should read '>=3.X', not {project['requires-python']!r}"
    return int(m[1]), int(m[2])
