"""The dashboard's actions: signing in and out, and replaying or purging dead letters, one or all
those of a reason. Each action is a GET that only shows what it will do and asks to confirm, then a
POST (CSRF-checked, signed in, actions on: :class:`~lbs.dashboard.security.Guard`) that does it and
writes one line to the action log (:func:`~lbs.dashboard.security.log_action`): a sign-in or
sign-out, a wrong token, an action done, refused or failed."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .._streamids import is_stream_id
from ..deadletters import DeadLetters
from ..exceptions import LbsError
from .app import Dashboard, dash, page
from .pages import one_letter
from .security import log_action, read_form

__all__ = ["routes"]

ACTIONS = ("replay", "purge")


def _safe_next(target: str) -> str:
    """A redirect target inside this dashboard (an absolute path, never another site)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


async def login(request: Request) -> Response:
    d = dash(request)
    nxt = _safe_next(request.query_params.get("next", "/"))
    if not d.guard.token:
        return RedirectResponse(nxt, status_code=303)
    token = request.query_params.get("token")  # the link printed at start (as Jupyter's)
    if token is not None:
        if d.guard.sign_in(request, token):
            log_action(request, "signed in (link)", action="sign-in")
            return RedirectResponse(nxt, status_code=303)
        log_action(
            request, "a wrong token (link): not signed in", level=logging.WARNING, action="sign-in"
        )
        return d.render(request, "login.html", {"next": nxt, "wrong": True}, status=403)
    if request.method == "POST":
        form = await read_form(request)
        d.guard.check_post(request, form)
        if d.guard.sign_in(request, str(form.get("token", ""))):
            log_action(request, "signed in", action="sign-in")
            return RedirectResponse(_safe_next(str(form.get("next", "/"))), status_code=303)
        log_action(request, "a wrong token: not signed in", level=logging.WARNING, action="sign-in")
        return d.render(request, "login.html", {"next": nxt, "wrong": True}, status=403)
    return d.render(request, "login.html", {"next": nxt, "wrong": False})


async def _login(request: Request) -> Response:
    try:
        return await login(request)
    except HTTPException as exc:
        return dash(request).error(request, exc.status_code, str(exc.detail))


async def logout(request: Request) -> Response:
    d = dash(request)
    form = await read_form(request)
    try:
        d.guard.check_post(request, form)
    except HTTPException as exc:
        return d.error(request, exc.status_code, str(exc.detail))
    if request.session.get("auth"):
        log_action(request, "signed out", action="sign-out")
    request.session.clear()
    return RedirectResponse("/login" if d.guard.token else "/", status_code=303)


def _flash(request: Request, text: str, kind: str = "ok") -> None:
    request.session["flash"] = [*request.session.get("flash", []), {"text": text, "kind": kind}]


async def _may_act(d: Dashboard, request: Request, action: str, what: str) -> dict[str, str]:
    """The form of a POST that may act (actions on, signed in, CSRF and origin checked); a refusal
    is logged (``what``: the action as the log says it) and raised."""
    try:
        d.guard.check_action(request)
        form = await read_form(request)
        d.guard.check_post(request, form)
    except HTTPException as exc:
        service = request.path_params["service"]
        log_action(
            request,
            "%s refused: %s",
            what,
            str(exc.detail).removeprefix("refused: "),
            level=logging.WARNING,
            action=action,
            service=service,
        )
        raise
    return form


async def _logged(
    d: Dashboard,
    request: Request,
    action: str,
    what: str,
    doing: Callable[[], Awaitable[tuple[str, bool]]],
) -> tuple[str, bool]:
    """Do ``doing``: its line (and whether it did what was asked) logged after ``what``, at WARNING
    when it did not, its failure too (at WARNING, the error's URLs masked, then raised)."""
    service = request.path_params["service"]
    try:
        text, ok = await doing()
    except (LbsError, RedisError, OSError) as exc:
        log_action(
            request,
            "%s failed: %s",
            what,
            d.masked(exc),
            level=logging.WARNING,
            action=action,
            service=service,
        )
        raise
    level = logging.INFO if ok else logging.WARNING
    log_action(request, "%s: %s", what, text, level=level, action=action, service=service)
    return text, ok


async def _act(
    d: Dashboard,
    request: Request,
    action: str,
    what: str,
    *,
    ids: list[str] | None,
    reason: str,
    until: str,
) -> str:
    """Do ``action`` on the selected letters; one line for the flash message, logged after ``what``
    (its failure too)."""
    service = request.path_params["service"]

    async def doing() -> tuple[str, bool]:
        return await _do(d, service, action, ids=ids, reason=reason, until=until), True

    text, _ = await _logged(d, request, action, what, doing)
    return text


async def _do(
    d: Dashboard, service: str, action: str, *, ids: list[str] | None, reason: str, until: str
) -> str:
    async with DeadLetters(d.fleet.client, service, config=d.fleet.config) as dlq:
        selection: dict[str, Any] = {"reason": reason or None, "until": until or None}
        if not ids:
            selection["all"] = not reason
        if action == "replay":
            done = await dlq.replay(ids, **selection)
            got = [r for r in done if r.outcome == "replayed"]
            others = [f"{r.letter_id}: {r.outcome}" for r in done if r.outcome != "replayed"]
            text = f"replayed {len(got)} letter(s)" + (
                f" as {', '.join(r.entry_id for r in got[:5])}" if got else ""
            )
            return text + (f"; not replayed: {', '.join(others[:5])}" if others else "")
        return f"purged {await dlq.purge(ids, **selection)} letter(s)"


@page
async def act_on_letter(request: Request) -> Response:
    """``/s/{service}/dead-letters/{letter}/{action}``: GET confirms, POST acts."""
    d = dash(request)
    service, lid, action = (request.path_params[k] for k in ("service", "letter", "action"))
    if action not in ACTIONS or not is_stream_id(lid):
        raise HTTPException(404, "no such action")
    what = f"{action} {service} letter {lid}"
    if request.method == "GET":
        d.guard.check_action(request)
        found, _ = await one_letter(d, service, lid)
        ctx = {
            "service": service,
            "tab": "letters",
            "action": action,
            "letters": [found],
            "count": 1,
            "ids": lid,
        }
        return d.render(request, "confirm.html", ctx)
    await _may_act(d, request, action, what)
    result = await _act(d, request, action, what, ids=[lid], reason="", until="")
    _flash(request, f"{service}: {result}")
    return RedirectResponse(f"/s/{service}/dead-letters", status_code=303)


@page
async def by_reason(request: Request) -> Response:
    """``/s/{service}/dead-letters-all/{action}?reason=``: every letter (of a reason), confirmed with
    its count; the POST acts on no letter written after the count (``until``)."""
    d = dash(request)
    service, action = request.path_params["service"], request.path_params["action"]
    if action not in ACTIONS:
        raise HTTPException(404, "no such action")
    if request.method == "GET":
        d.guard.check_action(request)
        reason = request.query_params.get("reason", "").strip()
        async with DeadLetters(d.fleet.client, service, config=d.fleet.config) as dlq:
            count, newest = await dlq.matching(reason=reason or None, all=not reason)
            shown = await dlq.list(10, reason=reason or None)
        ctx = {
            "service": service,
            "tab": "letters",
            "action": action,
            "letters": shown,
            "count": count,
            "reason": reason,
            "until": newest,
        }
        return d.render(request, "confirm.html", ctx)
    form = await _may_act(d, request, action, f"{action} {service} letters")
    reason, until = str(form.get("reason", "")), str(form.get("until", ""))
    which = f"reason {reason!r}" if reason else "all"
    if not until:
        what = f"{action} {service} letters ({which})"
        log_action(request, "%s: nothing to %s", what, action, action=action, service=service)
        _flash(request, f"{service}: nothing to {action}", "warn")
    else:
        what = f"{action} {service} letters ({which}, until {until})"
        result = await _act(d, request, action, what, ids=None, reason=reason, until=until)
        _flash(request, f"{service}: {result}")
    back = f"/s/{service}/dead-letters" + (f"?reason={quote(reason)}" if reason else "")
    return RedirectResponse(back, status_code=303)


def routes() -> list[Route]:
    return [
        Route("/login", _login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route(
            "/s/{service}/dead-letters/{letter}/{action}", act_on_letter, methods=["GET", "POST"]
        ),
        Route("/s/{service}/dead-letters-all/{action}", by_reason, methods=["GET", "POST"]),
    ]
