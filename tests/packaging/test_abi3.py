"""The opt-in limited-API build (LBS_LIMITED_API=1, see setup.py): one wheel,
tagged cp310-abi3, whose core is a single _core.abi3.so that imports and works.

Not the default: issue 21 measured it at about 4% more client instructions
per assignment than the per-version build (the core's calls into Python go
through functions instead of macros and tuple-based calls instead of
vectorcall), so the published wheels stay per version.
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from _pyprojects import ROOT
from _venvs import clean_env, run

pytestmark = pytest.mark.timeout(600)

# Build products a developer's tree may hold; a wheel built beside them could pick them up.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.so",
    "*.c",
    "*.html",
    ".*_cache",
    ".hypothesis",
    ".benchmarks",
    "fuzz-findings",
)


@pytest.fixture(scope="module")
def abi3_wheel(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    tree = tmp_path_factory.mktemp("tree") / "lbs"
    shutil.copytree(ROOT, tree, ignore=_NOT_SOURCES)
    # The tree copied: the session's release build (conftest's dist_build, in the tree) starts now
    # and compiles on the other core while this one builds.
    request.getfixturevalue("dist_build")
    out = tmp_path_factory.mktemp("dist")
    # No isolation: the dev environment has setuptools and Cython, and this
    # test is about the build mode, not about fetching the build requirements.
    run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out, tree],
        cwd=tree,
        timeout=540,
        env=clean_env(LBS_LIMITED_API="1"),
    )
    (whl,) = out.glob("*.whl")
    return whl


def test_limited_api_wheel_is_tagged_abi3_with_one_abi3_core(abi3_wheel: Path) -> None:
    assert "-cp310-abi3-" in abi3_wheel.name, abi3_wheel.name
    cores = [n for n in zipfile.ZipFile(abi3_wheel).namelist() if n.endswith(".so")]
    assert cores == ["_lbscore/_core.abi3.so"], cores


def test_limited_api_core_imports_and_works(abi3_wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(abi3_wheel).extractall(tmp_path / "site")
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import _lbscore, _lbscore._core as core\n"
        "assert core.__file__.endswith('_core.abi3.so'), core.__file__\n"
        "assert _lbscore.decode_input(_lbscore.encode_input('s', {'a': 1})) == ('s', {'a': 1})\n"
        "r = core.RespReader(); r.feed(memoryview(b'*1\\r\\n:7\\r\\n'))\n"
        "assert r.gets() == [7]\n"
    )
    # Isolated and from the temporary directory, so the source tree cannot be imported.
    run([sys.executable, "-I", "-c", probe, tmp_path / "site"], cwd=tmp_path, timeout=60)
