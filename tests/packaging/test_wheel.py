"""The wheel stands on its own: built, installed into a brand-new venv, and
imported from outside the source tree, it runs on its compiled core."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, text=True, timeout=600,
    )
    (whl,) = out.glob("lbs-*.whl")
    return whl


def test_wheel_ships_compiled_code_and_stubs_not_sources(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("_lbscore/_core.") and n.endswith(".so") for n in names), names
    for required in ("_lbscore/_core.pyi", "_lbscore/py.typed", "lbs/py.typed", "lbs/__init__.py"):
        assert required in names
    leaked = [n for n in names if n.endswith((".pyx", ".pxd", ".c", ".h"))]
    assert not leaked, leaked


def test_wheel_installs_into_a_fresh_venv_and_uses_its_core(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=600)
    probe = (
        "import importlib.machinery, sys, lbs, _lbscore, _lbscore._core as core\n"
        "assert core.__file__.startswith(sys.prefix), core.__file__\n"
        "assert core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))\n"
        "assert lbs.decode_input is core.decode_input\n"
        "assert lbs.producer._core_encode is core.encode_input\n"
        "assert lbs.decode_input(lbs.encode_input('s', {'a': 1})) == ('s', {'a': 1})\n"
        "print(core.__file__)\n"
    )
    # From an empty directory, so the source tree cannot be imported by accident.
    proc = subprocess.run([str(py), "-I", "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(env_dir) in proc.stdout
