"""Start a task eagerly: run its coroutine's first step now, schedule it only if it suspends.

``run()`` starts one task per assigned stream. Most of a short handler's
cost is asyncio's scheduling (a Handle, a loop iteration, a done callback:
about 7 us a task on the 2-core test machine); a handler that finishes
without suspending needs none of it. Python 3.12 has this as
``asyncio.Task(..., eager_start=True)``. On 3.11 :func:`start_task` gets the
same effect from the public constructor: it creates a real ``asyncio.Task``
while capturing the one ``loop.call_soon`` that would schedule its first
step, then runs that step at once, with the task as the current task (so
``asyncio.current_task()``, ``asyncio.timeout()`` and ``TaskGroup`` inside
the handler see the handler's own task, as they would with
``create_task``). A task that suspends continues as an ordinary task.

Loops that cannot be intercepted that way (a task factory is set, or the
loop is not a plain ``asyncio.BaseEventLoop``, like uvloop) get a plain
``loop.create_task``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

__all__ = ["start_task"]


if sys.version_info >= (3, 12):

    def start_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                   name: str | None = None) -> asyncio.Task[Any]:
        """A task running ``coro``, whose first step has already run."""
        if loop.get_task_factory() is not None:
            return loop.create_task(coro, name=name)
        return asyncio.Task(coro, loop=loop, name=name, eager_start=True)  # type: ignore[call-arg,unused-ignore]

else:  # pragma: no cover - exercised on 3.11, the version CI runs
    from asyncio import tasks as _tasks

    _enter_task = _tasks._enter_task
    _leave_task = _tasks._leave_task

    class _Capture:
        """Stands in for ``loop.call_soon`` while one Task is constructed."""

        __slots__ = ("step", "context")

        def __init__(self) -> None:
            self.step: Any = None
            self.context: Any = None

        def __call__(self, callback: Any, *args: Any, context: Any = None) -> None:
            self.step, self.context = callback, context

    def start_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                   name: str | None = None) -> asyncio.Task[Any]:
        """A task running ``coro``, whose first step has already run."""
        if loop.get_task_factory() is not None or not isinstance(loop, asyncio.BaseEventLoop):
            return loop.create_task(coro, name=name)
        capture = _Capture()
        loop.call_soon = capture  # type: ignore[method-assign,assignment]
        try:
            task = asyncio.Task(coro, loop=loop, name=name)
        finally:
            del loop.call_soon
        if capture.step is None:  # pragma: no cover - defensive
            raise RuntimeError("asyncio.Task did not schedule its first step through loop.call_soon")
        current = _tasks.current_task(loop)
        if current is not None:
            _leave_task(loop, current)
        try:
            if capture.context is not None:
                capture.context.run(capture.step)
            else:
                capture.step()
        finally:
            if current is not None:
                _enter_task(loop, current)
        return task
