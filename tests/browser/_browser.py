"""Helpers of tests/browser: where things are, bounded waits, screenshots for the docs."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "img"
HANDLERS = "tests.browser._handlers"


def shoot(page: Any, name: str) -> None:
    """``docs/img/dashboard-<name>.png`` of the page, when ``LBS_SCREENSHOTS=1``."""
    if os.environ.get("LBS_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"dashboard-{name}.png"), full_page=True)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)
