"""lbs._waits: bounded waits that never lose the caller's cancellation (asyncio.wait_for < 3.12 can)."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

import lbs
from lbs._waits import wait_set, within


async def test_a_cancellation_with_the_event_set_in_the_same_iteration_is_raised() -> None:
    # What asyncio.wait_for on 3.10/3.11 swallows: the waited-for result and
    # the cancellation arrive together; it returns the result and the task
    # goes on, so a `while not stopping` loop never ends.
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_set(event, 10))
    await asyncio.sleep(0)  # waiting now
    event.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_cancellation_with_the_result_ready_is_raised_and_cancels_the_inner() -> None:
    inner_done = asyncio.Event()
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def get() -> int:
        try:
            return await queue.get()
        finally:
            inner_done.set()

    waiter = asyncio.create_task(within(get(), 10))
    await asyncio.sleep(0)
    queue.put_nowait(1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.wait_for(inner_done.wait(), 5)


async def test_wait_set_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_set(event, 10) is True
    assert await wait_set(event, 0) is True  # already set: no wait at all


async def test_within_times_out_after_cancelling_the_awaitable() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(asyncio.TimeoutError):
        await within(forever(), 0.01)
    assert cancelled.is_set()  # its clean-up ran before the timeout was raised


async def test_within_returns_the_result_and_passes_errors_through() -> None:
    async def value() -> int:
        return 7

    async def broken() -> None:
        raise KeyError("x")

    assert await within(value(), 5) == 7
    assert await within(value(), None) == 7
    with pytest.raises(KeyError):
        await within(broken(), 5)


def test_the_library_waits_only_through_these_helpers() -> None:
    src = Path(lbs.__file__).parent
    users = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if p.name != "_demo.py" and re.search(r"\bwait_for\(", p.read_text())
    ]
    assert users == [], f"asyncio.wait_for can lose a cancellation before Python 3.12: {users}"


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="Task.cancelling() is 3.11+: on 3.10 wait_set cannot "
    "see a swallowed cancellation, and this loop would never end",
)
async def test_a_loop_whose_cancellation_was_swallowed_stops_at_its_next_wait() -> None:
    # A library that catches CancelledError mid-call and goes on leaves the task's
    # cancelling() count up: lbs's loops stop at their next wait_set all the same.
    event = asyncio.Event()
    passes = 0

    async def swallowing_call() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # what some client libraries do on the way

    async def loop() -> None:
        nonlocal passes
        while True:
            passes += 1
            await swallowing_call()
            await wait_set(event, 0.01)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert passes == 1
