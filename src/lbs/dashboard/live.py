"""Live updates (``/events``, server-sent events): one small JSON snapshot of every service per
interval, computed once and shared by every open page, and only while one is open.

The :class:`Hub` runs its loop while at least one listener is connected: each interval it reads
every service's counters (one status read each, without the dead letters' reasons) and the
journal's tallies written since its last read, then hands the same JSON text to every listener.
The last listener gone, the loop stops: a dashboard nobody looks at costs Redis nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError

from .._urlmask import mask_secrets
from ..events import Event
from ..exceptions import LbsError
from .data import Fleet, read_journal, read_status, tally_series

__all__ = ["Hub", "TallyWindow", "live_snapshot"]

log = logging.getLogger("lbs.dashboard")
HOUR_MS = 3_600_000


class TallyWindow:
    """A service's ``tally`` events of the last hour, kept between snapshots: each read asks only
    for what the journal wrote since the newest one held."""

    def __init__(self) -> None:
        self.events: dict[str, Event] = {}
        self.newest_ms: int | None = None

    async def update(self, fleet: Fleet, service: str, now_ms: int) -> None:
        since = self.newest_ms if self.newest_ms is not None else now_ms - HOUR_MS
        found = await read_journal(fleet.client, service, since_ms=since, kinds=["tally"])
        for ev in found:
            self.events[ev.id] = ev
            self.newest_ms = max(self.newest_ms or 0, ev.time_ms)
        if self.newest_ms is None:
            self.newest_ms = now_ms - HOUR_MS
        old = now_ms - HOUR_MS
        self.events = {k: e for k, e in self.events.items() if e.time_ms >= old}


async def live_snapshot(fleet: Fleet, windows: dict[str, TallyWindow]) -> dict[str, Any]:
    """Every service's counters and its last hour's per-minute tallies, JSON-ready."""
    out: dict[str, Any] = {}
    for service in fleet.services:
        try:
            # No sample: the counters only (the backlog from the group's lag, exact from Redis 7.4),
            # not what each consumer holds: a snapshot costs the same however much is held.
            st = await read_status(fleet.client, service, fleet.config, letters=0, sample=0)
            window = windows.setdefault(service, TallyWindow())
            await window.update(fleet, service, st.time_ms)
            series = tally_series(window.events.values(), st.time_ms)
            out[service] = {
                "time_ms": st.time_ms,
                "exists": st.exists,
                "waiting": st.backlog,
                "held": st.pending,
                "parked": st.delayed.parked if st.delayed else 0,
                "names_waiting": st.names_waiting,
                "dead_letters": st.dead_letters,
                **{s: st.count(s) for s in ("alive", "late", "dead", "departed")},
                "done_hour": sum(series.done),
                "failed_hour": sum(series.failed),
                "done_minute": series.done[-1],
                "failed_minute": series.failed[-1],
                "series": series.to_dict() if series.any else None,
            }
        except (LbsError, RedisError, OSError) as exc:
            out[service] = {"error": mask_secrets(fleet.url, str(exc))}
    return out


class Hub:
    """Shares one snapshot loop among every open ``/events`` stream (see the module docstring)."""

    def __init__(self, produce: Callable[[], Awaitable[dict[str, Any]]], interval: float) -> None:
        self._produce = produce
        self.interval = interval
        #: Snapshots computed so far (one Redis read of every service each).
        self.reads = 0
        self.listeners = 0
        self._latest: str | None = None
        self._version = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def latest(self) -> dict[str, Any] | None:
        """The newest snapshot while the loop runs (None when nobody listens)."""
        return json.loads(self._latest) if self._latest is not None else None

    async def _loop(self) -> None:
        while self.listeners > 0 and not self._closed:
            try:
                data = await self._produce()
            except Exception:  # a bug must not end every open page's updates silently
                log.exception("lbs dashboard: a live snapshot failed")
                data = {"error": "the snapshot failed: see the dashboard's log"}
            self.reads += 1
            async with self._changed:
                self._latest = json.dumps(data, separators=(",", ":"))
                self._version += 1
                self._changed.notify_all()
            await asyncio.sleep(self.interval)

    async def listen(self) -> AsyncIterator[str]:
        """Each snapshot as JSON text, the newest first when one is fresh, until :meth:`close`."""
        self.listeners += 1
        if self._task is None or self._task.done():
            self._latest, self._version = None, 0
            self._task = asyncio.create_task(self._loop(), name="lbs-dashboard-live")
        seen = 0
        try:
            while True:
                async with self._changed:
                    while self._version == seen and not self._closed:
                        await self._changed.wait()
                    if self._closed:
                        return
                    seen, text = self._version, self._latest
                if text is not None:
                    yield text
        finally:
            self.listeners -= 1
            if self.listeners == 0 and self._task is not None:
                self._task.cancel()
                self._task = None
                self._latest = None

    async def close(self) -> None:
        """End every listener's stream and the loop (at shutdown)."""
        self._closed = True
        async with self._changed:
            self._changed.notify_all()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
