"""The release files stand on their own: `make wheel`'s script leaves the sdist, a repaired
manylinux wheel with a stripped core and the plugins' wheels; installed into a brand-new venv,
the wheel runs a producer/consumer round trip on its compiled core, outside the tree."""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from _pyprojects import PLUGINS
from _venvs import HERE, Dist, Venv, clean_env, run

pytestmark = pytest.mark.timeout(900)  # the session's build and install come first


def test_dist_holds_the_sdist_the_manylinux_wheel_and_the_plugin_wheels(dist: Dist) -> None:
    names = sorted(p.name for p in dist.path.iterdir())
    assert len(names) == 2 + len(PLUGINS), names
    assert re.search(r"[-.]manylinux_2_\d+_x86_64\.whl$", dist.wheel.name), dist.wheel.name
    assert not [n for n in names if n.endswith("-linux_x86_64.whl")], (
        "the unrepaired wheel is left behind"
    )
    for plugin in PLUGINS:
        (whl,) = dist.path.glob(f"{plugin.replace('-', '_')}-*-py3-none-any.whl")
        assert "License-Expression: MIT" in _metadata(whl)


def _metadata(whl: Path) -> str:
    name, version = whl.name.split("-")[:2]
    return zipfile.ZipFile(whl).read(f"{name}-{version}.dist-info/METADATA").decode()


def test_the_sdist_carries_the_cython_sources_not_generated_c(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        names = sdist.getnames()
    assert any(n.endswith("src/_lbscore/_core.pyx") for n in names)
    assert any(n.endswith("src/lbs/_redis/lua/done-n.lua") for n in names)
    assert any(n.endswith("src/lbs/dashboard/templates/base.html") for n in names)
    # Generated C, a built core, Cython's annotation pages: none (the dashboard's templates are sources).
    assert not [n for n in names if n.endswith((".c", ".so"))]
    assert not [n for n in names if n.endswith(".html") and "/_lbscore/" in n]


def test_the_wheel_ships_a_stripped_core_and_stubs_not_sources(dist: Dist, tmp_path: Path) -> None:
    with zipfile.ZipFile(dist.wheel) as whl:
        names = whl.namelist()
        (core,) = [n for n in names if n.startswith("_lbscore/_core.") and n.endswith(".so")]
        so = Path(whl.extract(core, tmp_path))
    for required in (
        "_lbscore/_core.pyi",
        "_lbscore/py.typed",
        "lbs/py.typed",
        "lbs/__init__.py",
        "lbs/dashboard/templates/base.html",
        "lbs/dashboard/static/dashboard.css",
        "lbs/dashboard/static/dashboard.js",
    ):
        assert required in names
    assert not [n for n in names if n.endswith((".pyx", ".pxd", ".c", ".h"))]
    assert "License-Expression: MIT" in _metadata(dist.wheel)
    # The release build (setup.py): no debug information, no static symbol table.
    with so.open("rb") as f:
        sections = {s.name for s in ELFFile(f).iter_sections()}
    assert not {s for s in sections if s.startswith(".debug")} and ".symtab" not in sections, (
        sorted(sections)
    )


def _probe(installed: Venv, workdir: Path, *args: str) -> Any:
    # -I: neither the script's directory nor the working directory is put on sys.path.
    out = run(
        [installed.python, "-I", HERE / "_probe_roundtrip.py", *args],
        cwd=workdir,
        env=clean_env(),
        timeout=300,
    ).stdout
    return json.loads(out.splitlines()[-1])


def test_the_installed_wheel_runs_a_round_trip_on_its_own_core(
    installed: Venv, redis_server: Any, service: str, workdir: Path
) -> None:
    got = _probe(installed, workdir, redis_server.url, service, "20")
    site = str(installed.path / "lib")
    assert got["lbs"].startswith(site) and got["core"].startswith(site), got
    assert got["core"].endswith(".so")
    assert got["seen"] == sorted(f"{service}-{i}" for i in range(20))
    assert got["done"] == 20
    # The extras installed the plugins themselves, found by their entry points.
    assert got["plugins"] == sorted(PLUGINS)


def test_the_installed_dashboard_serves_its_pages_and_assets(
    installed: Venv, redis_server: Any, service: str, workdir: Path
) -> None:
    """The [dashboard] extra from the wheel: the templates and static files are in the package."""
    code = (
        "import sys, httpx, asyncio\n"
        "from lbs.dashboard import DashboardSettings, create_app\n"
        "async def main():\n"
        "    app = create_app(DashboardSettings.make(sys.argv[1], [sys.argv[2]]))\n"
        "    async with app.router.lifespan_context(app):\n"
        "        t = httpx.ASGITransport(app=app)\n"
        "        async with httpx.AsyncClient(transport=t, base_url='http://127.0.0.1:8787') as h:\n"
        "            for path in ('/', '/static/dashboard.css', f'/s/{sys.argv[2]}/consumers'):\n"
        "                r = await h.get(path)\n"
        "                print(path, r.status_code, len(r.text))\n"
        "asyncio.run(main())\n"
    )
    installed.pip_install("httpx")  # the test's client, not the dashboard's dependency
    out = run(
        [installed.python, "-I", "-c", code, redis_server.url, service],
        cwd=workdir,
        env=clean_env(),
        timeout=120,
    ).stdout
    rows = [line.split() for line in out.splitlines()]
    assert [(path, code) for path, code, _ in rows] == [
        ("/", "200"),
        ("/static/dashboard.css", "200"),
        (f"/s/{service}/consumers", "200"),
    ], out
    assert all(int(size) > 200 for _, _, size in rows), out
