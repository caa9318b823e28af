"""The root project and the first-party plugins publish consistent metadata: the plugins
depend on the root's distribution name, every project asks the same Python floor and lists
the same CPython classifiers, and licenses are SPDX strings. Pure parsing: nothing is built."""

from __future__ import annotations

from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from _pyprojects import PLUGINS, ROOT, ROOT_PYPROJECT, python_classifiers, python_floor

ROOT_PROJECT = ROOT_PYPROJECT["project"]
ALL = {"(root)": ROOT_PYPROJECT, **PLUGINS}

each_plugin = pytest.mark.parametrize("plugin", sorted(PLUGINS))
each_project = pytest.mark.parametrize("name", sorted(ALL))


def _requirements(project: dict[str, Any]) -> list[Requirement]:
    return [Requirement(r) for r in project.get("dependencies", [])]


def test_there_are_plugins_to_check() -> None:
    assert len(PLUGINS) >= 3, sorted(PLUGINS)


def test_the_root_distribution_is_not_the_unrelated_lbs() -> None:
    # The name "lbs" on the public index belongs to another project; the import name stays lbs.
    assert canonicalize_name(ROOT_PROJECT["name"]) == "lbs-streams"
    assert (ROOT / "src" / "lbs" / "__init__.py").is_file()


@each_plugin
def test_a_plugin_depends_on_the_root_distribution_at_a_version_it_has(plugin: str) -> None:
    project = PLUGINS[plugin]["project"]
    names = {canonicalize_name(r.name): r for r in _requirements(project)}
    assert "lbs" not in names, f"{plugin} depends on 'lbs', an unrelated project on the index"
    req = names.get(canonicalize_name(ROOT_PROJECT["name"]))
    assert req is not None, f"{plugin} must depend on {ROOT_PROJECT['name']}"
    assert str(req.specifier).startswith(">="), (
        f"{plugin}: give lbs-streams a lower bound, not {req}"
    )
    assert req.specifier.contains(Version(ROOT_PROJECT["version"])), (
        f"{plugin}: {req} excludes this lbs"
    )


@each_plugin
def test_the_root_has_an_extra_that_installs_each_plugin(plugin: str) -> None:
    project = PLUGINS[plugin]["project"]
    extra = plugin.removeprefix("lbs-")
    (req,) = [Requirement(r) for r in ROOT_PROJECT["optional-dependencies"][extra]]
    assert canonicalize_name(req.name) == canonicalize_name(project["name"])
    assert req.specifier.contains(Version(project["version"])), (
        f"[{extra}] = {req} excludes the plugin's version"
    )


@each_project
def test_every_project_asks_the_same_python_floor(name: str) -> None:
    pyproject = ALL[name]
    assert python_floor(pyproject["project"]) == python_floor(ROOT_PROJECT)
    floor = ".".join(map(str, python_floor(ROOT_PROJECT)))
    assert pyproject["tool"]["mypy"]["python_version"] == floor, (
        "mypy must check the oldest Python supported"
    )


@each_project
def test_every_project_lists_each_supported_python_from_the_floor(name: str) -> None:
    versions = python_classifiers(ALL[name]["project"])
    assert versions == python_classifiers(ROOT_PROJECT)
    major, minor = python_floor(ROOT_PROJECT)
    assert versions == [(major, m) for m in range(minor, minor + len(versions))], (
        "from the floor, no gaps"
    )
    assert versions[-1] >= (3, 13)


@each_project
def test_licenses_are_spdx_strings_and_ship_the_license_text(name: str) -> None:
    pyproject = ALL[name]
    # A table ({text = ...}) makes setuptools >= 77 warn; SPDX strings need it as the backend.
    assert pyproject["project"]["license"] == ROOT_PROJECT["license"] == "MIT"
    assert not [
        c for c in pyproject["project"].get("classifiers", []) if c.startswith("License ::")
    ]
    (backend,) = [
        Requirement(r) for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")
    ]
    assert backend.specifier.contains("77") and not backend.specifier.contains("76.9")
    directory = ROOT if name == "(root)" else ROOT / "plugins" / name
    assert (directory / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
