"""One start/stop lifecycle for a client's activities (reader, heartbeat, finisher, recovery ...).

An activity is one task (recovery: a few) that works for the client in the
background. :meth:`Activity.start` creates it, named ``lbs-<kind>-<consumer
id>``; :meth:`Activity.stop` cancels it and waits until it has really ended
(cancelled again while redis-py swallows a cancellation); :meth:`Activity.running`
lists what it runs, which ``Lifecycle.abandon`` cancels without a farewell, as
the death of the process would (:func:`lbs.testing.abandon`). The finisher and
the keyed sender start when work is queued for them (again after a stop), the
others when the client starts.

A task's body handles its own failures: it backs off and tries again, or
gives up and says so where a waiter hears it (the reader's STREAM_TERMINATED
notification and ``lbs_reader_terminated`` hook; a finisher's waiters get the
error of their batch; ``run()``'s failure is :meth:`ClientState.fail`). The
client stops its activities in one fixed order (``Lifecycle.shutdown``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, ClassVar

from .._redis.connection import cancel_and_wait

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from .state import ClientState

__all__ = ["Activity"]


class Activity:
    """A background task of one client with :meth:`start` and :meth:`stop`."""

    #: The middle of the task's name (``lbs-<kind>-<consumer id>``): ``class Reader(Activity, kind="reader")``.
    kind: ClassVar[str] = ""
    state: ClientState
    #: The running task (None before start and after stop).
    task: asyncio.Task[None] | None = None

    def __init_subclass__(cls, kind: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind:
            cls.kind = kind

    def _main(self) -> Coroutine[Any, Any, None]:
        """The task's body."""
        raise NotImplementedError

    def running(self) -> list[asyncio.Task[Any] | None]:
        """Every task this activity runs now (what :meth:`stop` ends)."""
        return [self.task]

    def start(self) -> None:
        self.task = asyncio.create_task(self._main(), name=f"lbs-{self.kind}-{self.state.names.id}")

    async def stop(self) -> None:
        """Cancel the tasks and wait until they have ended."""
        await cancel_and_wait(self.running())
        self.task = None
