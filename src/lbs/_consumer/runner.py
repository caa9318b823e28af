"""``run()``: a handler per assigned stream, each in its own eagerly started task.

The reader hands each taken stream to :meth:`Runner.dispatch`, which starts
the application's handler at once. When the handler returns, the stream goes
to the finisher (batched with every other stream finishing at the same
time); when it raises, or runs past its timeout (then it is cancelled), the
stream is handed back with a retry counted and parked for the retry
back-off (``Config.retry_delay``; :mod:`lbs._consumer.delays` brings it
back), so a stream that always fails ends in the dead-letter stream. A
disowned stream's handler is cancelled by the heartbeat. Every handler's
run time goes to ``stats.handler_seconds``.

**Timeouts.** A handler that finishes in its first step never gets a timer;
one that suspends gets a ``loop.call_later`` that cancels its task, itself
cancelled when the task ends. A handler that timed out counts as timed out
whatever it does after the cancellation (swallow it, return, raise).

**Eager start.** Most of a short handler's cost is asyncio's scheduling (a
Handle, a loop iteration, a done callback: about 7 us a task on the 2-core
test machine); a handler that finishes without suspending needs none of it.
Python 3.12 has this as ``asyncio.Task(..., eager_start=True)``. On 3.11
:func:`start_task` gets the same effect from the public constructor: it
creates a real ``asyncio.Task`` while capturing the one ``loop.call_soon``
that would schedule its first step, then runs that step at once, with the
task as the current task (so ``asyncio.current_task()``,
``asyncio.timeout()`` and ``TaskGroup`` inside the handler see the
handler's own task, as they would with ``create_task``). A task that
suspends continues as an ordinary task. Loops that cannot be intercepted
that way (a task factory is set, or the loop is not a plain
``asyncio.BaseEventLoop``, like uvloop) get a plain ``loop.create_task``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from types import CoroutineType
from typing import Any

from _lbscore import Held

from .._redis.connection import topology_error
from ..exceptions import RedisOperationError
from ..notifications import Notification
from .backoff import Backoff
from .finisher import Finisher
from .requeue import Requeue
from .state import ClientState

__all__ = ["Handler", "Runner", "handler_coroutine", "start_task"]

Handler = Callable[[Notification], Awaitable[Any]]


if sys.version_info >= (3, 12):

    def start_task(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], name: str | None = None
    ) -> asyncio.Task[Any]:
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

        __slots__ = ("context", "step")

        def __init__(self) -> None:
            self.step: Any = None
            self.context: Any = None

        def __call__(self, callback: Any, *args: Any, context: Any = None) -> None:
            self.step, self.context = callback, context

    def start_task(
        loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], name: str | None = None
    ) -> asyncio.Task[Any]:
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
            raise RuntimeError(
                "asyncio.Task did not schedule its first step through loop.call_soon"
            )
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


class Runner:
    """Handlers for one client's ``run()``: started per taken stream, finished or handed back as they end."""

    def __init__(
        self,
        state: ClientState,
        finisher: Finisher,
        requeue: Requeue,
        handler: Handler,
        timeout: float | None = None,
    ) -> None:
        self.state, self.finisher, self.requeue, self.handler = state, finisher, requeue, handler
        #: Seconds a handler may run before it is cancelled (None: no limit).
        self.timeout = timeout
        self._loop = asyncio.get_running_loop()
        #: Handler tasks whose timer fired (they were cancelled for it).
        self._timed_out: set[asyncio.Task[Any]] = set()

    def dispatch(self, h: Held, note: Notification) -> None:
        """Start the handler of a taken stream (the reader calls this for each)."""
        started = _clock()
        task = start_task(
            self._loop, handler_coroutine(self.handler, note), f"lbs-handler-{h.stream}"
        )
        if task.done():
            self._ended(h, started, None, task)
        else:
            h.task = task
            self.state.handlers.add(task)
            timer = (
                None
                if self.timeout is None
                else self._loop.call_later(self.timeout, self._time_out, task)
            )
            task.add_done_callback(partial(self._ended, h, started, timer))

    def _time_out(self, task: asyncio.Task[Any]) -> None:
        if task.done():
            return  # it ended just now; its done callback has yet to run
        self._timed_out.add(task)
        task.cancel(f"the handler ran past its timeout ({self.timeout:g}s)")

    def _ended(
        self, h: Held, started: float, timer: asyncio.TimerHandle | None, task: asyncio.Task[Any]
    ) -> None:
        """A handler ended: finish its stream, or hand it back if it raised or timed out."""
        s = self.state
        s.stats.handler_seconds.observe(_clock() - started)
        timed_out = False
        if timer is not None:
            timer.cancel()
            if task in self._timed_out:
                self._timed_out.discard(task)
                timed_out = True
        h.task = None
        s.handlers.discard(task)
        if s.run_limit:
            s.holdings.free()
        if s.holdings.table.get(h.entry_id) is not h:
            return  # disowned or handed back while it ran: the stream is not ours to finish
        exc: BaseException | None
        if timed_out:
            s.stats.handler_timeouts += 1
            if s.stopping.is_set():
                return  # close() hands the stream back
            exc = TimeoutError(f"handler timed out after {self.timeout:g}s")
        elif task.cancelled():
            if s.stopping.is_set():
                return  # close() ran out of drain time: it hands the stream back
            # Cancelled by someone else: hand it back (a retry counted, as for a
            # failure), or the held stream would leak under a healthy heartbeat.
            exc = asyncio.CancelledError("the handler was cancelled")
        else:
            exc = task.exception()
        s.holdings.drop(h)
        if exc is None:
            self.finisher.queue(h)
            return
        trace = ""
        if timed_out:
            reason = str(exc)
            s.log.on(h).warning(
                "%s on %s (entry %s); handing it back", reason, h.stream, h.entry_id
            )
        else:
            s.stats.handler_failures += 1
            reason = f"handler raised {type(exc).__name__}: {exc}"[:500]
            trace = failure_traceback(exc)
            s.log.on(h).warning(
                "handler failed on %s (entry %s): %s; handing it back",
                h.stream,
                h.entry_id,
                reason,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        s.journal.failed(h, reason, trace)
        hand_back = asyncio.ensure_future(self._hand_back(h, reason, trace))
        s.handlers.add(hand_back)
        hand_back.add_done_callback(s.handlers.discard)

    async def _hand_back(self, h: Held, reason: str, trace: str = "") -> None:
        """Hand a failed stream back; a failure that means "not now" (a dropped connection, a
        restarting or loading Redis, a moved slot) is tried again with a back-off for up to a lease
        TTL (requeue-6.lua checks the entry is pending to us under our lease: a call that ran twice
        hands back once). After that, or after any other failure, the stream stays pending to this
        consumer, and recovery brings it back only once the lease is gone (this process closed or
        died)."""
        s = self.state
        backoff = Backoff(s.config.read_retry_initial, s.config.read_retry_max)
        until = time.monotonic() + s.config.lock_ttl
        while True:
            try:
                await self.requeue.hand_back(
                    [h], count_retry=True, reason=reason, delay=None, traceback=trace
                )
                return
            except RedisOperationError as err:
                wait = backoff.next()
                if (
                    not topology_error(err)
                    or s.stopping.is_set()
                    or time.monotonic() + wait > until
                ):
                    s.log.on(h).error(
                        "hand-back of %s failed (%s); it stays pending to this consumer until "
                        "its lease is gone",
                        h.stream,
                        err,
                    )
                    return
                s.log.warning(
                    "hand-back of %s failed (%s); trying again in %.2fs", h.stream, err, wait
                )
                await asyncio.sleep(wait)


_clock = time.perf_counter

#: The most of a traceback a dead letter keeps (its last characters: the innermost frames and the error).
TRACEBACK_CHARS = 8192


def failure_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as text, at most :data:`TRACEBACK_CHARS` (cut at the start)."""
    text = "".join(traceback.format_exception(exc))
    return text if len(text) <= TRACEBACK_CHARS else "...\n" + text[-TRACEBACK_CHARS:]


def handler_coroutine(
    handler: Callable[[Any], Awaitable[Any]], arg: Any
) -> Coroutine[Any, Any, Any]:
    """``handler(arg)`` as a coroutine for :func:`start_task`: an awaitable that is not one is awaited
    inside one, and a plain function that raised is one that raises (a failed handler)."""
    try:
        aw = handler(arg)
    except Exception as exc:
        return _raised(exc)
    return aw if type(aw) is CoroutineType else _awaited(aw)


async def _awaited(aw: Awaitable[Any]) -> Any:
    return await aw


async def _raised(exc: BaseException) -> None:
    raise exc
