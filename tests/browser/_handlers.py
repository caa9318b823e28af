"""Handlers of the browser tests' ``lbs worker`` processes (``tests.browser._handlers:NAME``).

Each writes ``<event> <pid> <stream> <retry_count>`` lines to ``$LBS_TEST_LOG``.
"""

from __future__ import annotations

import asyncio
import os

import lbs


def _log(event: str, note: lbs.Notification) -> None:
    with open(os.environ["LBS_TEST_LOG"], "a") as f:
        f.write(f"{event} {os.getpid()} {note.stream} {note.retry_count}\n")


async def work(note: lbs.Notification) -> None:
    """Works ``$LBS_TEST_WORK`` seconds (default 0.2), then is done."""
    await asyncio.sleep(float(os.environ.get("LBS_TEST_WORK", "0.2")))
    _log("done", note)


async def hold(note: lbs.Notification) -> None:
    """Holds its stream for an hour: still holding when its process is killed."""
    _log("started", note)
    await asyncio.sleep(3600)


async def flaky(note: lbs.Notification) -> None:
    """Fails while the file ``$LBS_TEST_FAIL_FLAG`` exists, else is done."""
    if os.path.exists(os.environ["LBS_TEST_FAIL_FLAG"]):
        raise RuntimeError(f"{note.stream}: refused while the flag file is set")
    _log("done", note)
