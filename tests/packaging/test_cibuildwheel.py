"""[tool.cibuildwheel] cannot run here (no Docker), so its promises are checked by reading it:
the wheels it selects are exactly CPython of the classifiers x manylinux x the chosen
architectures, and its test command names what exists. Pure parsing: nothing is built."""

from __future__ import annotations

import re
import shlex
from fnmatch import fnmatch
from typing import Any

from _pyprojects import ROOT, ROOT_PYPROJECT, python_classifiers, python_floor

CIBW: dict[str, Any] = ROOT_PYPROJECT["tool"]["cibuildwheel"]
LINUX: dict[str, Any] = CIBW.get("linux", {})
PROJECT = ROOT_PYPROJECT["project"]

#: The Linux identifiers cibuildwheel can build for CPython 3.8-3.14 (free-threaded included).
_PLATFORMS = [
    f"{libc}_{arch}"
    for libc in ("manylinux", "musllinux")
    for arch in ("x86_64", "i686", "aarch64", "ppc64le", "s390x", "armv7l", "riscv64")
]
UNIVERSE = [
    f"cp3{minor}{t}-{platform}"
    for minor in range(8, 15)
    for t in ("", "t")
    for platform in _PLATFORMS
]


def _selectors(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return value.split() if isinstance(value, str) else list(value)


def _selected() -> set[str]:
    """What cibuildwheel builds on Linux: matching `build`, not `skip`, on an arch of `archs`."""
    build, skip = _selectors(CIBW.get("build")), _selectors(CIBW.get("skip"))
    archs = _selectors(LINUX.get("archs", CIBW.get("archs")))
    return {
        i
        for i in UNIVERSE
        if any(fnmatch(i, b) for b in build)
        and not any(fnmatch(i, s) for s in skip)
        and i.split("_", 1)[1] in archs
    }


def test_the_wheels_built_are_cpython_of_the_classifiers_on_manylinux_and_both_archs() -> None:
    versions = python_classifiers(PROJECT)
    expected = {
        f"cp{major}{minor}-manylinux_{arch}"
        for major, minor in versions
        for arch in ("x86_64", "aarch64")
    }
    assert _selected() == expected
    assert min(versions) == python_floor(PROJECT), (
        "the oldest wheel must be for requires-python's floor"
    )


def test_every_selector_does_something() -> None:
    build = _selectors(CIBW["build"])
    for pattern in build:
        assert [i for i in UNIVERSE if fnmatch(i, pattern)], (
            f"build selector {pattern!r} matches nothing"
        )
    for pattern in _selectors(CIBW.get("skip")):
        matched = [i for i in UNIVERSE if fnmatch(i, pattern) and any(fnmatch(i, b) for b in build)]
        assert matched, f"skip selector {pattern!r} skips nothing that would be built"
    assert _selected(), "the skip selectors leave nothing to build"


def test_both_archs_use_one_manylinux_image() -> None:
    images = {arch: LINUX.get(f"manylinux-{arch}-image") for arch in _selectors(LINUX["archs"])}
    assert len(set(images.values())) == 1 and re.fullmatch(
        r"manylinux_2_\d+", str(images["x86_64"])
    ), images


def test_the_test_command_runs_pytest_on_paths_of_the_project_with_extras_it_has() -> None:
    argv = shlex.split(CIBW["test-command"])
    assert argv[0] == "pytest"
    paths = [a for a in argv if a.startswith("{project}/")]
    assert paths, "the test command should name test paths under {project}"
    for path in paths:
        assert (ROOT / path.removeprefix("{project}/")).exists(), path
    for extra in _selectors(CIBW.get("test-extras")):
        assert extra in PROJECT["optional-dependencies"], extra
    for profile in (a.split("=", 1)[1] for a in argv if a.startswith("--hypothesis-profile=")):
        registered = re.search(
            rf'register_profile\(\s*"{re.escape(profile)}"', (ROOT / "conftest.py").read_text()
        )
        assert registered, profile
