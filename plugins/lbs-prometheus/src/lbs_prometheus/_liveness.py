"""``/livez``: whether the process is alive. Each event loop a running client started on is sent a
no-op from the checking thread (the HTTP server's); a loop that does not run it in time is named with
its thread and where that thread is. Redis plays no part."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import lbs

    from ._collector import ClientRecord

__all__ = ["liveness"]


def liveness(
    clients: Iterable[tuple[lbs.Client, ClientRecord]], timeout: float
) -> tuple[bool, dict[str, Any]]:
    """Whether the process is alive, and the body ``/livez`` answers with; waits up to ``timeout`` s.

    Each distinct event loop a running client started on is sent a no-op
    (``call_soon_threadsafe``) from the calling thread; alive when every
    one runs it within ``timeout`` seconds (``loop_lag``: how long it
    took). A loop that does not (blocked by code that never yields, or
    stopped), or is closed under a client never closed, is dead: named
    with its thread and, when Python can tell, where that thread is
    (``blocked_at``, innermost frame last). A reader that gave up
    (``Config.read_max_retries``) is dead too: it reads again only after
    a restart. Redis plays no part: an unreachable Redis leaves this
    alive (:meth:`LbsCollector.readiness` says it). No client running: alive (the
    process answered), with an empty ``clients``.
    """
    listed: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []
    probes: dict[int, _LoopProbe] = {}
    for _, rec in clients:
        service, consumer = rec.labels
        entry: dict[str, Any] = {"service": service, "consumer": consumer}
        listed.append(entry)
        if not rec.running:
            entry["state"] = "closed"
            continue
        entry["state"] = "running"
        if rec.reader_terminations:
            dead.append(
                {
                    "service": service,
                    "consumer": consumer,
                    "reason": "its reader gave up (Config.read_max_retries): only a restart "
                    "reads again",
                }
            )
        loop = rec.loop() if rec.loop is not None else None
        if loop is None:
            if rec.loop is not None:  # collected: it closed under a running client
                dead.append(_entry(service, consumer, rec, "its event loop is gone"))
            continue
        probe = probes.get(id(loop))
        if probe is None:
            probe = probes[id(loop)] = _LoopProbe(loop)
        probe.entries.append((entry, rec))
    deadline = time.monotonic() + timeout
    for probe in probes.values():
        answered = probe.wait(max(0.0, deadline - time.monotonic()))
        for entry, rec in probe.entries:
            service, consumer = rec.labels
            if probe.closed:
                dead.append(
                    _entry(service, consumer, rec, "its event loop is closed (client not closed)")
                )
            elif answered:
                entry["loop_lag"] = round(probe.lag, 4)
            else:
                sick = _entry(
                    service,
                    consumer,
                    rec,
                    f"its event loop did not run a callback within {timeout:g}s "
                    "(blocked, or stopped)",
                )
                where = _stack_of(rec.thread)
                if where:
                    sick["blocked_at"] = where
                dead.append(sick)
    ok = not dead
    body: dict[str, Any] = {"status": "ok" if ok else "unhealthy", "clients": listed}
    if not ok:
        body["unhealthy"] = dead
    return ok, body


class _LoopProbe:
    """One no-op sent to one event loop from the checking thread: did it run, and how soon."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.entries: list[tuple[dict[str, Any], ClientRecord]] = []
        self.lag = 0.0
        self.closed = False
        self._ran = threading.Event()
        self._sent = time.monotonic()
        try:
            loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # "Event loop is closed"
            self.closed = True

    def _run(self) -> None:
        self.lag = time.monotonic() - self._sent
        self._ran.set()

    def wait(self, timeout: float) -> bool:
        return not self.closed and self._ran.wait(timeout)


def _entry(service: str, consumer: str, rec: ClientRecord, reason: str) -> dict[str, Any]:
    out: dict[str, Any] = {"service": service, "consumer": consumer, "reason": reason}
    if rec.thread is not None:
        out["thread"] = rec.thread[1]
    return out


def _stack_of(thread: tuple[int, str] | None, limit: int = 8) -> list[str]:
    """Where ``thread`` is now, innermost frame last (``file:line in function``); [] if unknown."""
    if thread is None:
        return []
    frame = sys._current_frames().get(thread[0])
    if frame is None:
        return []
    return [
        f"{f.filename}:{f.lineno} in {f.name}" for f in traceback.extract_stack(frame, limit=limit)
    ]
