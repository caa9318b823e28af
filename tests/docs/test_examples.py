"""Every ```python block of the docs (``docs/**/*.md``) and of ``README.md`` runs against a real Redis.

One test per block, named ``page:line`` (the line of its opening fence). Each block runs as a
program of its own (``python -W error``) in a fresh directory, against a redis-server of its own,
so examples may use fixed names; the example URL ``redis://127.0.0.1:6380`` is replaced by that
server's. A block whose first line names a file (``# myapp/work.py``) is also written there before
any block of its page runs, so the page's other blocks can import it. An example must end by
itself: one that runs a worker stops it once its work is done.

A block that cannot run as it stands is marked on the line before its fence::

    <!-- test: skip, the reason -->

and is reported as skipped with that reason. Any other ``<!-- test: NAME -->`` marker is a label
another test finds the block by; the block still runs here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from lbs.embedded import RedisServer, ServerNotFoundError, find_redis_server

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: The URL the examples are written with; never a server anyone runs (tests start their own).
DOC_URL = "redis://127.0.0.1:6380"
#: Long enough for a loaded 2-core machine; an example that does not end by itself fails here.
TIMEOUT = 120.0

_MARKER = re.compile(r"<!--\s*test:\s*(.*?)\s*-->")
_FILE_LINE = re.compile(r"#\s*([\w./-]+\.py)\s*")
_URL = re.compile(r"rediss?(?:\+cluster)?://[^\s\"')]+")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    code: str
    marker: str | None  # the text of a <!-- test: ... --> right before the fence

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker is None or not re.match(r"skip\b", self.marker):
            return None
        return self.marker[len("skip") :].lstrip(" ,")

    @property
    def filename(self) -> str | None:
        first = self.code.split("\n", 1)[0]
        found = _FILE_LINE.fullmatch(first)
        return found.group(1) if found else None


def blocks_of(path: Path) -> list[Block]:
    """The ```python blocks of a Markdown file (fences may be indented, as in a list item)."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("```"):
            fence = stripped[: len(stripped) - len(stripped.lstrip("`"))]
            lang = stripped[len(fence) :].strip()
            indent = len(lines[i]) - len(lines[i].lstrip())
            start = i
            body: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != fence:
                body.append(lines[i][indent:])
                i += 1
            if lang == "python":
                before = [line.strip() for line in lines[:start] if line.strip()]
                marker = _MARKER.fullmatch(before[-1]) if before else None
                found.append(
                    Block(
                        str(path.relative_to(ROOT)),
                        start + 1,
                        "\n".join(body) + "\n",
                        marker.group(1) if marker else None,
                    )
                )
        i += 1
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def test_the_docs_have_examples_and_well_formed_markers() -> None:
    assert len(BLOCKS) >= 8, [b.id for b in BLOCKS]
    for block in BLOCKS:
        if block.marker is not None and block.marker.startswith("skip"):
            assert block.skip_reason, (
                f"{block.id}: a skip marker needs a reason: <!-- test: skip, REASON -->"
            )
    for page in PAGES:
        names = [b.filename for b in BLOCKS if b.page == str(page.relative_to(ROOT)) and b.filename]
        assert len(names) == len(set(names)), f"{page}: two blocks claim one file name: {names}"


def _program(block: Block, url: str) -> str:
    return block.code.replace(DOC_URL, url)


def _binary(server: str) -> str | None:
    """The redis-server an example runs on: the development server (8.x), or Debian's 7.x."""
    if server == "redis8":
        return None
    try:
        return find_redis_server(
            min_version=(7, 0), below_version=(8, 0), env_var="LBS_REDIS7_SERVER"
        )
    except ServerNotFoundError as exc:
        if os.environ.get("LBS_REQUIRE_REDIS7") == "1":
            pytest.fail(f"LBS_REQUIRE_REDIS7=1 but {exc}")
        pytest.skip(f"Redis 7 needs Debian's redis-server 7.x: {exc}")


@pytest.mark.parametrize("server", ["redis8", "redis7"])
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_the_example_runs(block: Block, server: str, tmp_path: Path) -> None:
    """On Redis 8.x and on 7.x, with every plugin the environment has installed (the first-party ones,
    after ``make setup``): installing one must never break a server lbs supports."""
    if block.skip_reason:
        pytest.skip(block.skip_reason)
    others = sorted(set(_URL.findall(block.code)) - {DOC_URL})
    assert not others, (
        f"{block.id} uses {others}: examples connect to {DOC_URL} (the test replaces it)"
    )
    with RedisServer(_binary(server), config={"notify-keyspace-events": "Kx"}) as server_:
        _write_named_files(block.page, server_.url, tmp_path)
        _run(block, server_.url, tmp_path, block.filename or "example.py", block.id)


def _write_named_files(page: str, url: str, tmp_path: Path) -> None:
    """The page's named files, in ``tmp_path``, for its blocks to import."""
    for other in BLOCKS:
        if other.page == page and other.filename:
            target = tmp_path / other.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(_program(other, url))


def _run(block: Block, url: str, tmp_path: Path, filename: str, what: str) -> None:
    """Run ``block`` against ``url`` as ``tmp_path / filename``; fail naming ``what`` unless it
    exits 0 within :data:`TIMEOUT`."""
    script = tmp_path / filename
    script.write_text(_program(block, url))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    try:
        proc = subprocess.run(
            [sys.executable, "-W", "error", str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{what} did not end within {TIMEOUT:.0f} s (an example must stop by itself)\n"
            f"{exc.stdout!r}\n{exc.stderr!r}"
        )
    assert proc.returncode == 0, (
        f"{what} failed (exit code {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    )


def test_the_quickstart_runs_twice_on_one_redis(tmp_path: Path) -> None:
    """A reader follows the quickstart's examples top to bottom, then again, on the same Redis (the
    page's one on port 6380): each passes both times, none counts on a Redis nothing else wrote."""
    page = "docs/quickstart.md"
    blocks = [b for b in BLOCKS if b.page == page and not b.skip_reason]
    assert any("collect_status" in b.code for b in blocks), [b.id for b in blocks]
    with RedisServer(config={"notify-keyspace-events": "Kx"}) as server:
        _write_named_files(page, server.url, tmp_path)
        for round_ in (1, 2):
            for block in blocks:
                _run(block, server.url, tmp_path, "example.py", f"{block.id}, round {round_}")
