"""The dashboard's read-only pages: the overview (with every service on the Redis listed), consumers,
streams, recovery, failures, dead letters, the live stream (``/events``) and ``/api/status.json``.
Each reads Redis through :mod:`.data` when it is asked for; only ``/events`` repeats, through the
shared :class:`~lbs.dashboard.live.Hub`."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._streamids import is_stream_id
from ..deadletters import DeadLetter, DeadLetters, letter_time_ms
from ..exceptions import LbsError
from ..status import ServiceStatus
from .app import Dashboard, dash, page
from .charts import bar_chart
from .data import (
    NO_HISTORY,
    Series,
    read_journal,
    read_services,
    read_shards,
    read_status,
    recovery_timeline,
    search_streams,
    tally_series,
)
from .live import HOUR_MS
from .procmetrics import announced, read_all

__all__ = ["one_letter", "routes"]

#: Letters a dead-letter page lists.
LETTERS_SHOWN = 100


async def _series(d: Dashboard, service: str, now_ms: int) -> Series:
    """The last hour's tallies: the live hub's when it runs, else read now."""
    window = d.windows.get(service)
    if d.hub.listeners and window is not None and window.newest_ms is not None:
        return tally_series(window.events.values(), now_ms)
    events = await read_journal(d.fleet.client, service, since_ms=now_ms - HOUR_MS, kinds=["tally"])
    return tally_series(events, now_ms)


def _charts(series: Series) -> dict[str, Any]:
    empty = "" if series.any else NO_HISTORY
    return {
        "done": bar_chart(
            series.done, series.start_ms, label="handled per minute", kind="done", empty=empty
        ),
        "failed": bar_chart(
            series.failed, series.start_ms, label="failed per minute", kind="failed", empty=empty
        ),
        "done_hour": sum(series.done),
        "failed_hour": sum(series.failed),
        "done_minute": series.done[-1],
        "failed_minute": series.failed[-1],
    }


@page
async def overview(request: Request) -> Response:
    d = dash(request)
    cards, placements = [], []
    for base in d.settings.services:
        if d.settings.shards > 1:  # each shard a card; the shards' slots and masters in one table
            sh = await read_shards(d.fleet.client, base, d.settings.shards, d.fleet.config)
            placements.append(sh)
            found = [s.status for s in sh.shards if not s.legacy]
        else:
            found = [await read_status(d.fleet.client, base, d.fleet.config, letters=100)]
        for st in found:
            cards.append({"st": st, "charts": _charts(await _series(d, st.service, st.time_ms))})
    ctx: dict[str, Any] = {
        "cards": cards,
        "placements": placements,
        "tab": "overview",
        "listed_error": "",
    }
    try:  # every service on this Redis, the shown ones linked (a SCAN refused: said, not a 503)
        ctx["listed"], ctx["listed_count"] = await read_services(
            d.fleet.client, d.fleet.config, first=d.settings.shown_services
        )
    except (LbsError, RedisError) as exc:
        ctx["listed"], ctx["listed_count"], ctx["listed_error"] = [], 0, d.masked(exc)
    return d.render(request, "overview.html", ctx)


@page
async def charts(request: Request) -> Response:
    """The two charts of one service, as an HTML fragment (the live script swaps them in)."""
    d = dash(request)
    service = request.path_params["service"]
    latest = d.hub.latest or {}
    now = latest.get(service, {}).get("time_ms")
    if now is None:
        now = (
            await read_status(d.fleet.client, service, d.fleet.config, letters=0, sample=0)
        ).time_ms
    c = _charts(await _series(d, service, now))
    return Response(f"{c['done']}{c['failed']}", media_type="text/html")


async def _status(d: Dashboard, request: Request) -> ServiceStatus:
    return await read_status(d.fleet.client, request.path_params["service"], d.fleet.config)


@page
async def consumers(request: Request) -> Response:
    d = dash(request)
    st = await _status(d, request)
    # Where each consumer's process serves its metrics (its newest `started` or tally says).
    said = await read_journal(d.fleet.client, st.service, kinds=["started", "tally"], count=2000)
    names = {c.name for c in st.consumers}
    urls = {c: url for c, url in announced(said).items() if c in names}
    ctx = {"st": st, "service": st.service, "tab": "consumers", "metrics": await read_all(urls)}
    return d.render(request, "consumers.html", ctx)


@page
async def streams(request: Request) -> Response:
    d = dash(request)
    st = await _status(d, request)
    q = request.query_params.get("q", "").strip()
    rows, scanned = await search_streams(d.fleet.client, st, d.fleet.config, q)
    ctx = {
        "st": st,
        "service": st.service,
        "tab": "streams",
        "q": q,
        "rows": rows,
        "scanned": scanned,
    }
    return d.render(request, "streams.html", ctx)


@page
async def recovery(request: Request) -> Response:
    d = dash(request)
    st = await _status(d, request)
    kinds = ["recovered", "retaken", "started", "stopped", "disowned"]
    events = await read_journal(
        d.fleet.client, st.service, since_ms=st.time_ms - HOUR_MS, kinds=kinds
    )
    ctx = {
        "st": st,
        "service": st.service,
        "tab": "recovery",
        "timeline": recovery_timeline(events),
        "dead": [c for c in st.consumers if c.state in ("dead", "late")],
    }
    return d.render(request, "recovery.html", ctx)


@page
async def failures(request: Request) -> Response:
    """The last hour's handler failures from the journal (``failed``: reason and traceback), newest
    first, filtered by stream name; what is still being retried, before any dead letter."""
    d = dash(request)
    st = await _status(d, request)
    q = request.query_params.get("q", "").strip()
    events = await read_journal(
        d.fleet.client, st.service, since_ms=st.time_ms - HOUR_MS, kinds=["failed"], count=1000
    )
    rows = [e for e in reversed(events) if q.lower() in e.fields.get("stream", "").lower()]
    ctx = {"st": st, "service": st.service, "tab": "failures", "rows": rows, "q": q}
    return d.render(request, "failures.html", ctx)


@page
async def letters(request: Request) -> Response:
    d = dash(request)
    service = request.path_params["service"]
    reason = request.query_params.get("reason", "").strip()
    st = await read_status(d.fleet.client, service, d.fleet.config, letters=500, sample=0)
    async with DeadLetters(d.fleet.client, service, config=d.fleet.config) as dlq:
        found = await dlq.list(LETTERS_SHOWN, reason=reason or None)
        now = await dlq.server_time_ms()
    rows = [(letter, now - letter_time_ms(letter.id)) for letter in found]
    ctx = {"st": st, "service": service, "tab": "letters", "reason": reason, "rows": rows}
    return d.render(request, "letters.html", ctx)


async def one_letter(d: Dashboard, service: str, lid: str) -> tuple[DeadLetter, int]:
    """The dead letter ``lid`` and the server's clock (ms); 404 when it is not (or no longer) there."""
    if not is_stream_id(lid):
        raise HTTPException(404, f"{lid!r} is not a dead-letter id")
    async with DeadLetters(d.fleet.client, service, config=d.fleet.config) as dlq:
        found = await dlq.get(lid)
        now = await dlq.server_time_ms()
    if found is None:
        raise HTTPException(404, f"no dead letter {lid} (replayed, purged or forwarded)")
    return found, now


@page
async def letter(request: Request) -> Response:
    d = dash(request)
    service, lid = request.path_params["service"], request.path_params["letter"]
    found, now = await one_letter(d, service, lid)
    ctx = {
        "service": service,
        "tab": "letters",
        "letter": found,
        "age_ms": now - letter_time_ms(lid),
    }
    return d.render(request, "letter.html", ctx)


@page
async def events(request: Request) -> Response:
    """Server-sent events: ``event: snapshot`` with the JSON of every service, once per interval."""
    hub = dash(request).hub

    async def stream() -> Any:
        yield f"retry: {max(1000, int(hub.interval * 1000))}\n\n"
        async for text in hub.listen():
            yield f"event: snapshot\ndata: {text}\n\n"

    headers = {"cache-control": "no-store", "x-accel-buffering": "no"}
    return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


@page
async def status_json(request: Request) -> Response:
    """Every service's :meth:`ServiceStatus.to_dict` (``lbs status --json``), by service name."""
    d = dash(request)
    found = await asyncio.gather(
        *(read_status(d.fleet.client, s, d.fleet.config) for s in d.fleet.services)
    )
    body = {st.service: st.to_dict() for st in found}
    return JSONResponse(json.loads(json.dumps(body)), headers={"cache-control": "no-store"})


def routes() -> list[Route]:
    return [
        Route("/", overview),
        Route("/events", events),
        Route("/api/status.json", status_json),
        Route("/s/{service}/charts", charts),
        Route("/s/{service}/consumers", consumers),
        Route("/s/{service}/streams", streams),
        Route("/s/{service}/recovery", recovery),
        Route("/s/{service}/failures", failures),
        Route("/s/{service}/dead-letters", letters),
        Route("/s/{service}/dead-letters/{letter}", letter),
    ]
