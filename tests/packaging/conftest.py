"""What the packaging tests share: the release files built once per session by
scripts/dist.sh (as `make wheel` does), and a brand-new venv with the repaired wheel
installed as a user would, outside the tree.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lbs.embedded import RedisServer

from _pyprojects import ROOT
from _venvs import Dist, Venv, run


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """scripts/dist.sh, as `make wheel` runs it, into a directory of its own (not the tree's dist/)."""
    out = tmp_path_factory.mktemp("dist")
    run([ROOT / "scripts" / "dist.sh", "--python", sys.executable, out], cwd=ROOT, timeout=900)
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
