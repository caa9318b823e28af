"""What the packaging tests share: the release files built once per session by
scripts/dist.sh (as `make wheel` does), and a brand-new venv with the repaired wheel
installed as a user would, outside the tree.

The builds are single-threaded; the first test that builds something else (test_abi3) starts
dist.sh in the background first (``dist_build``), so the two compile on both cores at once.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lbs.embedded import RedisServer

from _pyprojects import ROOT
from _venvs import Dist, Started, Venv


@pytest.fixture(scope="session")
def dist_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Started, Path]]:
    """scripts/dist.sh, as `make wheel` runs it, started into a directory of its own (not the
    tree's dist/); killed at the end of a session that never waited for it."""
    out = tmp_path_factory.mktemp("dist")
    build = Started(
        [ROOT / "scripts" / "dist.sh", "--python", sys.executable, out], cwd=ROOT, timeout=900
    )
    try:
        yield build, out
    finally:
        build.stop()


@pytest.fixture(scope="session")
def dist(dist_build: tuple[Started, Path]) -> Dist:
    """The release files of ``dist_build``, once it is done."""
    build, out = dist_build
    build.wait()
    return Dist(out)


@pytest.fixture(scope="session")
def installed(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A fresh venv with the manylinux wheel and every extra a user can ask for: pyspark, pyarrow
    and the dashboard's stack from the index, the plugins (extras [prometheus], [claim],
    [dlq-jsonl], [otel]) from dist/."""
    env = Venv.create(tmp_path_factory.mktemp("installed") / "venv")
    extras = "spark,prometheus,claim,dlq-jsonl,otel,dashboard"
    env.pip_install(f"{dist.wheel}[{extras}]", find_links=dist.path)
    return env


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """An empty working directory: the tree is not importable from it."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, for jobs whose key names are fixed."""
    with RedisServer() as server:
        yield server
