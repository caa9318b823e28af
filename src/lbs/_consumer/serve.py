"""``run()`` and ``run_keyed()``'s serving loop, and SIGTERM/SIGINT routed to the clients serving.

:func:`serve` hands every stream the reader takes to a dispatch (the
:class:`~lbs._consumer.runner.Runner`'s or the
:class:`~lbs._consumer.keyed.KeyedRunner`'s) until the client closes, with
the client's capacity set to the concurrency meanwhile. :data:`SIGNALS`
routes SIGTERM and SIGINT to every client in ``run()`` on the main thread's
loop: the first starts ``close()``, a second cuts the handlers' drain short.
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..config import require_number
from ..exceptions import ConfigurationError, LbsError
from ..keyed import KeyedHandler
from ..notifications import NotificationType
from .intake import Dispatch
from .keyed import KeyedRunner
from .lifecycle import Lifecycle
from .runner import Handler, Runner

__all__ = ["SIGNALS", "keyed_runner", "runner", "serve"]


class _SignalRoute:
    """SIGTERM/SIGINT to every client in ``run()`` on the main thread's loop.

    One handler per signal for the process, installed while at least one
    ``run()`` asks for it, so clients sharing a loop (a sharded client, the
    demo) all hear the signal, and the last one out restores the handlers
    that were there before. Each client registers its callback, ``on_signal(sig)``.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.clients: list[Callable[[signal.Signals], None]] = []
        self.before: dict[signal.Signals, Any] = {}  # the handlers to put back

    def catch(
        self, loop: asyncio.AbstractEventLoop, on_signal: Callable[[signal.Signals], None]
    ) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False
        if not self.clients:
            self.before = {sig: signal.getsignal(sig) for sig in self.SIGNALS}
            try:
                for sig in self.SIGNALS:
                    loop.add_signal_handler(sig, self._deliver, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # no Unix signals on this loop
                self._restore(loop)
                return False
        self.clients.append(on_signal)
        return True

    def release(
        self, loop: asyncio.AbstractEventLoop, on_signal: Callable[[signal.Signals], None]
    ) -> None:
        self.clients.remove(on_signal)
        if not self.clients:
            self._restore(loop)

    def _restore(self, loop: asyncio.AbstractEventLoop) -> None:
        for sig, handler in self.before.items():
            loop.remove_signal_handler(sig)
            if handler is not None:
                signal.signal(
                    sig, handler
                )  # asyncio would leave SIG_DFL: the application's own comes back

    def _deliver(self, sig: signal.Signals) -> None:
        for on_signal in list(self.clients):
            on_signal(sig)


SIGNALS = _SignalRoute()


async def serve(
    life: Lifecycle,
    dispatch: Dispatch,
    concurrency: int | None,
    handle_signals: bool,
    start: Callable[[], Awaitable[None]],
    notifications: Callable[[], AsyncIterator[Any]],
) -> None:
    """Hand every taken stream to ``dispatch`` until closed (``run()`` and ``run_keyed()``)."""
    if concurrency is not None:
        require_number(
            concurrency, "concurrency must be an integer of at least 1", integer=True, low=1
        )
    s = life.state
    cfg = s.config
    loop = asyncio.get_running_loop()
    life.reader.dispatch = dispatch
    s.capacity = s.run_limit = concurrency if concurrency is not None else cfg.max_streams

    def on_signal(sig: signal.Signals) -> None:
        if life.closing is None:
            s.log.warning("%s: stopping (drain %.1fs, then hand back)", sig.name, cfg.drain_timeout)
            life.begin_close()
        else:
            s.log.warning("%s again: handing back without waiting for handlers", sig.name)
            life.drain_cut.set()

    catching = handle_signals and SIGNALS.catch(loop, on_signal)
    try:
        await start()
        # STREAM_ADDED goes straight to the runner; the other notifications
        # (disowned, expired, terminated) are drained so they never fill the box. A STREAM_ADDED in
        # the box was read before run() took over (the client was started first): it runs now.
        async for note in notifications():
            if note.type is NotificationType.STREAM_ADDED:
                h = s.holdings.table.get(note.entry_id)
                if h is not None and h.task is None:
                    dispatch(h, note)
        if s.handlers:
            await asyncio.gather(*s.handlers, return_exceptions=True)
        if life.closing is not None:
            await asyncio.shield(life.closing)  # close() ran elsewhere: return once it is over
    except Exception as exc:
        # Nothing waits forever on a worker that is gone: wait_finished() and the notifications raise it.
        # lbs's own errors say what went wrong in their message (the caller gets them too); anything
        # else keeps its traceback.
        s.log.error("run() failed: %s", exc, exc_info=not isinstance(exc, LbsError))
        s.fail(exc)
        raise
    finally:
        if catching:
            SIGNALS.release(loop, on_signal)
        life.reader.dispatch = None
        s.run_limit, s.capacity = 0, cfg.max_streams


def runner(life: Lifecycle, handler: Handler | None, timeout: float | None) -> Runner:
    """``run()``'s runner: ``handler`` (None: the plugin's, hook ``lbs_handler``) with its ``timeout``
    (None: ``Config.handler_timeout``; infinite: no limit)."""
    s = life.state
    if handler is None:
        handler = s.hooks.ask("lbs_handler")
        if handler is None:
            raise ConfigurationError(
                "run() needs a handler: pass one, or install a plugin that "
                "implements the lbs_handler hook"
            )
    if not callable(handler):
        raise ConfigurationError(f"run() needs a callable handler, got {type(handler).__name__}")
    handler = s.hooks.wrap_handler(handler)  # once per run(): no plugin asks, nothing per call
    if timeout is None:
        timeout = s.config.handler_timeout
    else:
        require_number(timeout, "timeout must be None or a number of seconds > 0", above=True)
    limit = timeout if timeout is not None and math.isfinite(timeout) else None  # inf: no limit
    return Runner(s, life.finisher, life.requeue, handler, limit)


def keyed_runner(
    life: Lifecycle,
    handler: KeyedHandler,
    batch: int,
    max_hold_messages: int,
    max_hold_seconds: float,
    linger: float,
) -> KeyedRunner:
    """``run_keyed()``'s runner, its arguments checked."""
    if not callable(handler):
        raise ConfigurationError(
            f"run_keyed() needs a callable handler, got {type(handler).__name__}"
        )
    for name, value in (("batch", batch), ("max_hold_messages", max_hold_messages)):
        require_number(value, f"{name} must be an integer of at least 1", integer=True, low=1)
    require_number(max_hold_seconds, "max_hold_seconds must be a number > 0", above=True)
    require_number(
        linger, "linger must be a finite number >= 0 (0: let a drained key go at once)", finite=True
    )
    handler = life.state.hooks.wrap_handler(handler, "lbs_wrap_keyed_handler")
    return KeyedRunner(
        life.state,
        life.finisher,
        handler,
        life.requeue.delays.soon,
        batch=batch,
        max_hold_messages=max_hold_messages,
        max_hold_seconds=float(max_hold_seconds),
        linger=float(linger),
    )
