"""docs/PLUGINS.md stays true to the code: its example runs, and each hook is there with its exact signature."""

from __future__ import annotations

import asyncio
import inspect
import re
import sqlite3
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import lbs
from lbs import hookspecs
from lbs.plugins import make_plugin_manager

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "PLUGINS.md").read_text()
MARKER = "<!-- test: minimal-plugin -->"
HOOKS = [n for n in hookspecs.__all__ if n not in ("NAME", "hookimpl", "hookspec")]


def _marked_block() -> str:
    found = re.search(re.escape(MARKER) + r"\s*```python\n(.*?)```", GUIDE, re.S)
    assert found, f"docs/PLUGINS.md has no python block right after {MARKER}"
    return found.group(1)


def _marked_pyproject() -> dict[str, Any]:
    """The first toml block after the marked one: the example's pyproject.toml."""
    after = GUIDE[GUIDE.index(MARKER) :]
    found = re.search(r"```toml\n(.*?)```", after, re.S)
    assert found, "docs/PLUGINS.md has no pyproject.toml block after the example"
    parsed: dict[str, Any] = tomllib.loads(found.group(1))
    return parsed


def _load_example() -> types.ModuleType:
    """The marked block as a module, as ``import lbs_example`` would give it."""
    module = types.ModuleType("lbs_example")
    exec(compile(_marked_block(), "docs/PLUGINS.md:minimal-plugin", "exec"), module.__dict__)
    return module


def _implemented(module: types.ModuleType) -> list[str]:
    return [
        name
        for name, value in vars(module).items()
        if callable(value) and hasattr(value, hookspecs.NAME + "_impl")
    ]


def _documented_signatures() -> dict[str, list[list[str]]]:
    """Every hook table row's first cell, `` `lbs_x(a, b)` ``: hook name -> parameter lists found."""
    found: dict[str, list[list[str]]] = {}
    for name, params in re.findall(r"^\| `(lbs_\w+)\(([^)]*)\)` \|", GUIDE, re.M):
        found.setdefault(name, []).append([p.strip() for p in params.split(",") if p.strip()])
    return found


def test_every_hook_is_in_the_guide_with_its_exact_signature() -> None:
    assert HOOKS
    documented = _documented_signatures()
    missing = [name for name in HOOKS if name not in documented]
    assert not missing, f"docs/PLUGINS.md has no table row `name(params)` for {missing}"
    unknown = sorted(set(documented) - set(HOOKS))
    assert not unknown, f"docs/PLUGINS.md documents {unknown}, which lbs.hookspecs does not declare"
    for name in HOOKS:
        expected = list(inspect.signature(getattr(hookspecs, name)).parameters)
        rows = documented[name]
        assert len(rows) == 1, f"docs/PLUGINS.md has {len(rows)} rows for {name}"
        assert rows[0] == expected, (
            f"docs/PLUGINS.md shows {name}({', '.join(rows[0])}), "
            f"lbs.hookspecs declares {name}({', '.join(expected)})"
        )


def test_the_guide_describes_every_argument() -> None:
    """The arguments column names each parameter but ``client`` (as `p` or `p: type`)."""
    for name in HOOKS:
        row = re.search(r"^\| `" + name + r"\([^)]*\)` \|(.*)$", GUIDE, re.M)
        assert row, name
        arguments = row.group(1).split(" | ")[2]  # kind | called | arguments | return
        for param in inspect.signature(getattr(hookspecs, name)).parameters:
            if param != "client":
                assert f"`{param}`" in arguments or f"`{param}:" in arguments, (
                    f"docs/PLUGINS.md: the arguments of {name} do not describe {param!r}"
                )


def test_example_is_accepted_by_the_plugin_manager() -> None:
    module = _load_example()
    implemented = _implemented(module)
    assert implemented, "the example implements no hook"
    for name in implemented:
        assert name in HOOKS, f"{name} is not a hook in lbs.hookspecs"
    pm = make_plugin_manager([module], load_entrypoints=False)  # runs check_pending()
    assert pm.is_registered(module)
    for name in implemented:
        assert module in [impl.plugin for impl in getattr(pm.hook, name).get_hookimpls()]


def test_example_pyproject_publishes_the_module() -> None:
    project = _marked_pyproject()
    entry_points = project["project"]["entry-points"][hookspecs.NAME]
    modules = project["tool"]["setuptools"]["py-modules"]
    assert list(entry_points.values()) == modules == ["lbs_example"]


def test_example_counts_finished_streams() -> None:
    module = _load_example()
    pm = make_plugin_manager([module], load_entrypoints=False)
    client: Any = types.SimpleNamespace(service="thumbnails")
    held = [types.SimpleNamespace(stream=f"s{i}", entry_id=f"{i}-0", token=i) for i in range(3)]
    statuses = (lbs.DoneStatus.DONE, lbs.DoneStatus.DONE, lbs.DoneStatus.LOCK_LOST)
    pm.hook.lbs_locks_released(
        client=client, released=list(zip(held, statuses))
    )  # one finishing batch
    assert module.finished == {("thumbnails", "DONE"): 2, ("thumbnails", "LOCK_LOST"): 1}


def test_example_backend_is_inert_without_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LBS_EXAMPLE_DB", raising=False)
    pm = make_plugin_manager([_load_example()], load_entrypoints=False)
    assert (
        pm.hook.lbs_dead_letter_backend(client=types.SimpleNamespace(service="thumbnails")) is None
    )


def test_example_backend_keeps_each_letter_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = tmp_path / "dead.db"
    monkeypatch.setenv("LBS_EXAMPLE_DB", str(db))
    pm = make_plugin_manager([_load_example()], load_entrypoints=False)
    backend = pm.hook.lbs_dead_letter_backend(client=types.SimpleNamespace(service="thumbnails"))
    assert isinstance(backend, lbs.DeadLetterBackend)
    letters = [
        lbs.DeadLetter("1-0", {"_reason": "malformed", "lbs-input": "{"}),
        lbs.DeadLetter("2-0", {"_reason": "out of retries", "lbs-input": "{}"}),
    ]
    asyncio.run(backend.write(letters))
    asyncio.run(backend.write(letters[:1]))  # at-least-once: a batch can come again
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT service, id, reason, input FROM dead_letters ORDER BY id"
        ).fetchall()
    conn.close()
    assert rows == [
        ("thumbnails", "1-0", "malformed", "{"),
        ("thumbnails", "2-0", "out of retries", "{}"),
    ]
