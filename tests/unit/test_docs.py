"""The README and the docs stay true to the project: their commands, versions and layout."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _first_screen_commands() -> list[str]:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block, "README has no shell block"
    return [
        line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()
    ]


def test_first_screen_gives_exactly_two_commands() -> None:
    assert _first_screen_commands() == ["make demo", "make test"]
    assert README.index("make demo") < 2000, "the two commands must be on the first screen"


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = _first_screen_commands()[1]
    assert re.search(rf"^{re.escape(test_command)}$", ci, re.M), (
        ".ci/run must call the README's test command"
    )


def test_python_floor_matches_pyproject() -> None:
    floor = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert f"Python {floor}+" in README


def test_make_targets_named_in_the_docs_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for doc in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        for target in set(re.findall(r"`make (\w+)", doc.read_text())):
            assert re.search(rf"^{target}:", makefile, re.M), (
                f"{doc.name} names make {target}, Makefile lacks it"
            )


def test_files_named_in_architecture_exist() -> None:
    arch = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for path in re.findall(r"`((?:src|scripts|tests)/[^`]+)`", arch):
        first = path.split(",")[0].strip()
        assert list(ROOT.glob(first)), first
    assert len(arch.splitlines()) <= 100, "ARCHITECTURE.md is meant to fit one page"


def test_docs_never_import_the_private_core() -> None:
    # Docs may name the core's files; examples must use the public ``lbs`` names.
    for doc in [
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "plugins").rglob("*.md"),
    ]:
        assert not re.search(r"(import|from)\s+_lbscore", doc.read_text()), doc
