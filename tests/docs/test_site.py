"""The documentation site builds with warnings as errors, and its API reference covers ``lbs``.

``mkdocs build --strict`` fails on any warning: a broken link or anchor, a page outside the nav,
an API object mkdocstrings cannot find, a cross-reference that does not resolve, a missing
snippet file. The build goes into a temporary directory, never ``site/``.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "mkdocs", reason="the docs tests need the lbs[docs] extra (make setup installs it)"
)

import lbs
import lbs.exceptions

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = sorted((ROOT / "docs" / "api").glob("*.md"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    # Material prints a banner about MkDocs 2.0 on every build: news, not a warning about these docs.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    problems = [line for line in proc.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert proc.returncode == 0 and not problems, (
        f"mkdocs build --strict failed:\n{proc.stderr[-8000:]}"
    )
    return out


def _text(page: Path) -> str:
    """A built page's text, tags stripped (highlighted code is split into spans)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    assert (site / "index.html").exists() and (site / "api" / "clients" / "index.html").exists()


def test_the_guide_includes_the_readme_example_rather_than_a_copy(site: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = re.search(
        r"--8<-- \[start:using-it\] -->\n(.*?)<!-- --8<-- \[end:using-it\]", readme, re.S
    )
    assert section, "README.md has no using-it snippet section"
    code = re.search(r"```python\n(.*?)```", section.group(1), re.S)
    assert code
    guide = _text(site / "index.html")
    assert "--8<--" not in guide
    for line in code.group(1).splitlines():
        assert line.strip() in guide, f"the guide lacks README's line {line!r}"


def _documented() -> set[str]:
    return {m for page in API_PAGES for m in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M)}


def test_the_api_reference_covers_every_public_name() -> None:
    documented = _documented()
    missing = []
    for name in lbs.__all__:
        if name == "__version__":
            continue
        module = getattr(getattr(lbs, name), "__module__", None)
        if f"lbs.{name}" not in documented and module not in documented:
            missing.append(name)
    assert not missing, f"docs/api/*.md has no '::: lbs.NAME' (or its module) for {missing}"
    assert "lbs.exceptions" in documented and set(lbs.exceptions.__all__) <= set(lbs.__all__)


def test_the_readme_links_every_page_of_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1].split("\n\n", 1)[0]
    pages = [p for p in re.findall(r":\s*(\S+\.md)$", nav, re.M) if not p.startswith("api/")]
    readme = (ROOT / "README.md").read_text()
    for page in pages:
        assert f"](docs/{page})" in readme, f"README.md does not link docs/{page}"
