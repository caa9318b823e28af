"""docs/cli.md is what scripts/docs/cli_reference.py writes from the typer app now.

A new or changed command or option (or its help) fails here until the page is regenerated:

    .venv/bin/python scripts/docs/cli_reference.py
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import typer

from lbs.cli import app

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "docs" / "cli_reference.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cli_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_cli_md_is_current() -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page == _generator().render(), (
        "docs/cli.md is not what the typer app says: run .venv/bin/python scripts/docs/cli_reference.py"
    )


def test_every_command_and_option_is_on_the_page() -> None:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")

    def walk(command: object, path: list[str]) -> None:
        assert f"## `{' '.join(['lbs', *path])}`" in page, path
        for p in command.params:  # type: ignore[attr-defined]
            if p.param_type_name == "option" and not p.hidden:
                for name in [*p.opts, *p.secondary_opts]:
                    assert f"`{name}`" in page, (path, name)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])


def test_the_script_checks_and_does_not_depend_on_the_terminal() -> None:
    env = {**os.environ, "COLUMNS": "40", "TERM": "dumb", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
