"""Bounded waits that never lose a cancellation.

``asyncio.wait_for`` before Python 3.12 swallows a cancellation that
arrives in the same loop iteration as its awaitable's result: it returns
the result and the caller's task runs on as if never cancelled. In a
``while not stopping`` loop that is a task nothing can stop (seen at
interpreter shutdown, when every task is cancelled at once and one of them
sets the event another waits on). These helpers wait with
``asyncio.wait``, which always raises the caller's cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["wait_set", "within"]

T = TypeVar("T")


async def within(aw: Awaitable[T], timeout: float | None) -> T:
    """``await aw``, giving up after ``timeout`` seconds (``None``: no limit).

    Raises :class:`asyncio.TimeoutError` on timeout, after ``aw`` was
    cancelled and has finished; a cancellation of the caller cancels ``aw``
    and is always raised.
    """
    if timeout is None:
        return await aw
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait((task,), timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait((task,))  # its clean-up runs; our own cancellation still raises here
        if not task.cancelled() and task.exception() is None:
            return task.result()  # it finished just as it was cancelled: keep its result
        raise asyncio.TimeoutError
    return task.result()


async def wait_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; whether it is set.

    The waits of lbs's own loops. A task whose cancellation was swallowed
    on the way (a library that catches ``CancelledError`` mid-call and goes
    on; its ``cancelling()`` count stays up) stops here: it is raised again.
    """
    task = asyncio.current_task()
    if task is not None and getattr(task, "cancelling", lambda: 0)():
        raise asyncio.CancelledError("cancelled earlier; the cancellation was swallowed on the way")
    if event.is_set():
        return True
    try:
        await within(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass
    return event.is_set()
