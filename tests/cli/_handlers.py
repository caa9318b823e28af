"""Handlers for ``lbs worker`` in tests/cli (imported by the worker processes as ``tests.cli._handlers``).

Each writes one line per call to the file named by ``$LBS_TEST_LOG``:
``<event> <pid> <stream> <retry_count>`` (appends of one short line are atomic,
so processes can share the file).
"""

from __future__ import annotations

import asyncio
import os
import time

import lbs


def _log(event: str, note: lbs.Notification) -> None:
    with open(os.environ["LBS_TEST_LOG"], "a") as f:
        f.write(f"{event} {os.getpid()} {note.stream} {note.retry_count}\n")


async def ok(note: lbs.Notification) -> None:
    """Processes the stream at once."""
    _log("done", note)


async def slow(note: lbs.Notification) -> None:
    """Says it started, then works for an hour: still running when the worker is stopped."""
    _log("started", note)
    await asyncio.sleep(3600)


async def mixed(note: lbs.Notification) -> None:
    """Streams named ``hold*`` say they started, then wait until cancelled (``cancelled`` logged);
    the others are done at once."""
    if not note.stream.startswith("hold"):
        _log("done", note)
        return
    _log("started", note)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        _log("cancelled", note)
        raise


def sync(note: lbs.Notification) -> None:
    """Not async: refused by ``lbs worker``."""


async def two_args(note: lbs.Notification, other: object) -> None:
    """Takes two arguments: refused by ``lbs worker``."""


not_callable = 42


async def keyed(batch: lbs.KeyedBatch) -> None:
    """A keyed handler (found by its annotation): one effect per message in ``{<service>-input}:out``,
    then a short sleep (``$LBS_TEST_KEYED_SLEEP``, default 0.01 s) so that kills land mid-key."""
    out = batch.data_stream.partition("}:")[0] + "}:out"
    for m in batch.messages:
        batch.emit(out, {"key": batch.key, "n": m.fields["n"], "pid": os.getpid()}, m)
    await asyncio.sleep(float(os.environ.get("LBS_TEST_KEYED_SLEEP", "0.01")))


async def keyed_stall(batch: lbs.KeyedBatch) -> None:
    """As :func:`keyed`, but the batch holding message ``$LBS_TEST_STALL_AT`` emits its effects,
    logs ``stalled <pid>``, then blocks the whole process (no heartbeat, as a stop-the-world pause
    or SIGSTOP would) until the file ``$LBS_TEST_RESUME`` exists; then it returns at once."""
    out = batch.data_stream.partition("}:")[0] + "}:out"
    for m in batch.messages:
        batch.emit(out, {"key": batch.key, "n": m.fields["n"], "pid": os.getpid()}, m)
    if any(m.fields["n"] == os.environ["LBS_TEST_STALL_AT"] for m in batch.messages):
        with open(os.environ["LBS_TEST_LOG"], "a") as f:
            f.write(f"stalled {os.getpid()} {batch.key} {batch.token}\n")
        resume = os.environ["LBS_TEST_RESUME"]
        while not os.path.exists(resume):
            time.sleep(0.01)


async def fails_first(note: lbs.Notification) -> None:
    """Raises ``ValueError`` on a stream's first attempt (retry count 0); processes it on the next."""
    if note.retry_count == 0:
        _log("failed", note)
        raise ValueError(f"first try of {note.stream}")
    _log("done", note)
