"""Fixtures of tests/browser: Debian's chromium driven by Playwright (never a browser download),
``lbs worker`` and ``lbs dashboard`` processes against the session's real Redis.

The browser is ``$LBS_CHROMIUM`` (``make test`` sets it from ``scripts/chromium.sh``), else
``/usr/bin/chromium`` or a ``chromium`` on PATH; the tests are skipped, saying why, only when none
is there. ``LBS_SCREENSHOTS=1`` saves the main pages into ``docs/img/dashboard-*.png``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from _browser import wait_until

# tests/cli's helpers: the environment of an `lbs` process, a background process.
sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))
from _cli_helpers import Proc, Procs, cli_env

#: Chromium's flags: no sandbox (containers), and nothing that reaches the network by itself
#: (this closed network refuses it, and a test must not depend on it).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    found = os.environ.get("LBS_CHROMIUM") or shutil.which("chromium")
    if not found and os.access("/usr/bin/chromium", os.X_OK):
        found = "/usr/bin/chromium"
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One chromium for a module's tests. Not for the session: Playwright's sync API keeps an event
    loop running in this thread while it is open, and the async tests after it need the thread's."""
    path = chromium_path()
    if not path:
        pytest.skip("no chromium: set LBS_CHROMIUM or run scripts/chromium.sh (Debian's chromium)")
    if os.environ.get("LBS_CHROMIUM"):  # make test: the browser tests must run, not skip
        import playwright.sync_api as sync_api
    else:
        sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with (
        tempfile.TemporaryDirectory(prefix="lbs-chromium-") as profile,
        sync_api.sync_playwright() as pw,
    ):
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=path,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 860},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    browser.clear_cookies()
    p = browser.new_page()
    p.set_default_timeout(30_000)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def names() -> Callable[[str], str]:
    """``names("orders")``: a service name no other test uses, readable in a screenshot."""
    suffix = uuid.uuid4().hex[:4]
    return lambda kind: f"{kind}-{suffix}"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "handled.log"
    path.touch()
    return path


@pytest.fixture
def lbs_proc(tmp_path: Path, log: Path) -> Iterator[Callable[..., Proc]]:
    """``lbs_proc(*args, **env)``: ``python -m lbs ARGS`` in the background, killed at teardown."""
    procs = Procs(tmp_path, cli_env(log, COLUMNS="200"))
    try:
        yield procs.start
    finally:
        procs.kill_all()


@dataclass
class Dashboard:
    base: str
    token: str
    proc: Proc


@pytest.fixture
def start_dashboard(lbs_proc: Callable[..., Proc]) -> Callable[..., Dashboard]:
    """``start_dashboard(url, *services)``: ``lbs dashboard --actions --refresh 0.5`` on a free port,
    once it serves; its generated token read from what it printed."""

    def start(url: str, *services: str) -> Dashboard:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = lbs_proc(
            "dashboard",
            *services,
            "--url",
            url,
            "--port",
            str(port),
            "--actions",
            "--refresh",
            "0.5",
        )

        def serving() -> bool:
            assert proc.popen.poll() is None, proc.err()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            except OSError:
                return False
            return "the token (shown once)" in proc.err()

        wait_until(serving, "lbs dashboard serving")
        m = re.search(r"the token \(shown once\): (\S+)", proc.err())
        assert m, proc.err()
        return Dashboard(f"http://127.0.0.1:{port}", m.group(1), proc)

    return start
