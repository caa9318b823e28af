"""An operator's hands on live work from the dashboard (:class:`lbs.ServiceControls`): pause and
resume a service; release (hand back), cancel or force-claim a held stream.

As the dead-letter actions (:mod:`lbs.dashboard.actions`): a GET shows what the action will do and
asks to confirm (``control.html``, with an optional reason), a POST (actions on, signed in, CSRF and
origin checked) does it, writes one line to the action log (done, refused or failed) and flashes
its outcome. Who acts, as the journal and the pause's ``by`` say: ``dashboard (<who>)``, the action
log's own :func:`~lbs.dashboard.security.who`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .._streamids import is_stream_id
from ..controls import ControlOutcome, ServiceControls
from .actions import _flash, _logged, _may_act, _safe_next
from .app import Dashboard, dash, page
from .data import held_entry, read_pause
from .security import who

__all__ = ["routes"]

STREAM_ACTIONS = ("release", "cancel", "force-claim")

#: What each action does, as its confirmation page says it.
SAYS = {
    "pause": "Consumers take nothing new within a second; streams held now run on and finish. "
    "Registrations wait in the load-balancer stream until the service is resumed.",
    "resume": "Consumers take work again within a second.",
    "release": "Its holder cancels the handler and hands the stream back to the load-balancer "
    "stream, no retry counted; another consumer (or the same) takes it again.",
    "cancel": "Its holder cancels the handler and dead-letters the stream with your reason "
    "(replay brings it back).",
    "force-claim": "It goes back into the load-balancer stream now, whatever its holder does (for a "
    "holder stuck but alive), one retry counted (a dead letter past max_retries); the holder is "
    "told to drop it, and its handler may run until it looks.",
}
#: Outcomes of an action on a held stream that did what was asked.
DONE = ("released", "cancelled", "force-claimed", "dead-lettered")


def acting(request: Request) -> str:
    """Who acts, for :class:`lbs.ServiceControls`' ``by``: the dashboard and the action log's who."""
    return f"dashboard ({who(request)})"


def said(o: ControlOutcome) -> str:
    """One outcome in a few words: ``released 1-0 as 2-0``, ``1-0: not held (not pending)``."""
    if o.outcome == "released":
        return f"released {o.entry_id} as {o.detail}"
    if o.outcome == "cancelled":
        return f"cancelled {o.entry_id}: dead letter {o.detail}"
    if o.outcome in DONE:
        return f"{o.outcome} {o.entry_id} {o.detail}"
    return f"{o.entry_id}: {o.outcome}" + (f" ({o.detail})" if o.detail else "")


def _clock(ms: int) -> str:
    """A pause's ``since_ms`` as the pages show times (the server's clock, UTC)."""
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) if ms else "?"


async def _acted(
    d: Dashboard,
    request: Request,
    action: str,
    what: str,
    doing: Callable[[ServiceControls], Awaitable[tuple[str, bool]]],
) -> tuple[str, bool]:
    """Do ``doing`` on the service's :class:`lbs.ServiceControls`; its line (and whether it did
    what was asked) logged after ``what``, its failure too."""
    service = request.path_params["service"]

    async def controlled() -> tuple[str, bool]:
        async with ServiceControls(d.fleet.client, service, config=d.fleet.config) as controls:
            return await doing(controls)

    return await _logged(d, request, action, what, controlled)


def _with(what: str, reason: str) -> str:
    return f"{what} (reason {reason!r})" if reason else what


async def _service_action(request: Request, action: str) -> Response:
    d = dash(request)
    service = request.path_params["service"]
    if request.method == "GET":
        d.guard.check_action(request)
        now = await read_pause(d.fleet.client, service)
        ctx = {
            "service": service,
            "action": action,
            "heading": f"{action.capitalize()} {service}",
            "says": SAYS[action],
            "pause": now,
            "can": action == "pause" or now is not None,
            "nothing": f"{service} is not paused.",
            "asks_reason": action == "pause",
            "next": _safe_next(request.query_params.get("next", f"/s/{service}/consumers")),
        }
        return d.render(request, "control.html", ctx)
    form = await _may_act(d, request, action, f"{action} {service}")
    reason = str(form.get("reason", "")).strip()
    by = acting(request)

    async def pause(controls: ServiceControls) -> tuple[str, bool]:
        await controls.pause(by, reason)
        return "paused" + (f": {reason}" if reason else ""), True

    async def resume(controls: ServiceControls) -> tuple[str, bool]:
        was = await controls.resume(by)
        if was is None:
            return "resumed (it was not paused)", True
        return f"resumed (paused by {was.by} since {_clock(was.since_ms)})", True

    what = _with(f"{action} {service}", reason)
    text, _ = await _acted(d, request, action, what, pause if action == "pause" else resume)
    _flash(request, f"{service}: {text}")
    back = _safe_next(str(form.get("next", "")) or f"/s/{service}/consumers")
    return RedirectResponse(back, status_code=303)


@page
async def pause(request: Request) -> Response:
    """``/s/{service}/pause``: GET confirms (a reason may be given), POST pauses."""
    return await _service_action(request, "pause")


@page
async def resume(request: Request) -> Response:
    """``/s/{service}/resume``: GET confirms, POST resumes."""
    return await _service_action(request, "resume")


@page
async def act_on_stream(request: Request) -> Response:
    """``/s/{service}/streams/{entry_id}/{action}`` (release, cancel, force-claim): GET confirms (a
    reason may be given), POST acts on the held stream."""
    d = dash(request)
    service, eid, action = (request.path_params[k] for k in ("service", "entry_id", "action"))
    if action not in STREAM_ACTIONS or not is_stream_id(eid):
        raise HTTPException(404, "no such action")
    if request.method == "GET":
        d.guard.check_action(request)
        found = await held_entry(d.fleet.client, service, eid)
        ctx = {
            "service": service,
            "tab": "streams",
            "action": action,
            "heading": f"{action.capitalize()} entry {eid}",
            "says": SAYS[action],
            "entry_id": eid,
            "stream": found[0] if found else "",
            "holder": found[1] if found else "",
            "can": found is not None,
            "nothing": f"Entry {eid} is not held now (done, handed back or recovered).",
            "asks_reason": True,
            "next": f"/s/{service}/streams",
        }
        return d.render(request, "control.html", ctx)
    what = f"{action} {service} entry {eid}"
    form = await _may_act(d, request, action, what)
    reason = str(form.get("reason", "")).strip()
    by = acting(request)

    async def doing(controls: ServiceControls) -> tuple[str, bool]:
        if action == "release":
            (o,) = await controls.release([eid], by, reason)
        elif action == "cancel":
            (o,) = await controls.cancel([eid], by, reason)
        else:
            (o,) = await controls.force_claim([eid], by, reason)
        return said(o), o.outcome in DONE

    text, ok = await _acted(d, request, action, _with(what, reason), doing)
    _flash(request, f"{service}: {text}", "ok" if ok else "warn")
    return RedirectResponse(f"/s/{service}/streams", status_code=303)


def routes() -> list[Route]:
    return [
        Route("/s/{service}/pause", pause, methods=["GET", "POST"]),
        Route("/s/{service}/resume", resume, methods=["GET", "POST"]),
        Route("/s/{service}/streams/{entry_id}/{action}", act_on_stream, methods=["GET", "POST"]),
    ]
