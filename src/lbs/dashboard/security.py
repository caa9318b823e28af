"""Who may see and act: the token (a login form's signed session, or ``Authorization: Bearer``), the
CSRF token of each session checked on every POST with the request's Origin, and the action log.

* With a token (given, or generated because actions are on) every page needs it; without one
  (read-only on loopback) pages are open and there is nothing to act on.
* A POST carries the session's CSRF token (form field ``csrf`` or header ``X-CSRF-Token``) and, when
  the browser sends an ``Origin``, it is this dashboard's own. A Bearer request carries no cookie a
  third site could borrow, so it needs no CSRF token.
* Every action is logged on the ``lbs.dashboard`` logger (:func:`log_action`; ``lbs dashboard``
  writes it to stderr, as JSON with ``--log-format json``): who (the session's short id, or
  ``bearer``, and the peer's address), what, on which service and letters, and the result; a
  sign-in, a sign-out, a wrong token, an action refused or failed alike.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import Any
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request

__all__ = ["Guard", "action_log", "csrf_token", "log_action", "read_form", "who"]

action_log = logging.getLogger("lbs.dashboard")


#: The largest form body read (the dashboard's forms are a few short fields).
MAX_FORM_BYTES = 16_384


async def read_form(request: Request) -> dict[str, str]:
    """A POST's url-encoded form (the dashboard's forms are never multipart: no python-multipart)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, "form too large")
    if not body:
        return {}
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise HTTPException(415, f"a form is sent url-encoded, not as {kind or 'nothing'}")
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def csrf_token(request: Request) -> str:
    """The session's CSRF token (made on its first use)."""
    session = request.session
    token = session.get("csrf")
    if not isinstance(token, str):
        token = session["csrf"] = secrets.token_urlsafe(24)
    return token


def who(request: Request) -> str:
    """Who acts, for the action log: ``session <id>`` or ``bearer``, and the peer's address."""
    peer = request.client.host if request.client else "?"
    if _bearer(request) is not None:
        return f"bearer from {peer}"
    sid = request.session.get("sid", "anonymous")
    return f"session {sid} from {peer}"


def log_action(
    request: Request,
    what: str,
    *args: Any,
    level: int = logging.INFO,
    action: str | None = None,
    service: str | None = None,
) -> None:
    """One line of the action log, ``WHO: WHAT`` (``what % args``); who, the action and the service
    are also the record's ``who``, ``action`` and ``service`` (fields of a JSON log: :mod:`lbs.logs`)."""
    actor = who(request)
    extra = {"who": actor, "action": action, "service": service}
    action_log.log(level, "%s: " + what, actor, *args, extra=extra)


def _bearer(request: Request) -> str | None:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


class Guard:
    """The token and the actions switch of one dashboard, and the checks every route makes."""

    def __init__(self, token: str | None, actions: bool) -> None:
        self.token = token
        self.actions = actions

    def signed_in(self, request: Request) -> bool:
        """Whether the request may see the pages: no token, a signed-in session, or the Bearer token."""
        if not self.token:
            return True
        bearer = _bearer(request)
        if bearer is not None:
            return _same(bearer, self.token)
        return request.session.get("auth") is True

    def sign_in(self, request: Request, token: str) -> bool:
        """Sign the session in with ``token`` if it is the right one (a fresh session id and CSRF token)."""
        if not self.token or not _same(token, self.token):
            return False
        request.session.clear()
        request.session.update(auth=True, sid=secrets.token_hex(4), csrf=secrets.token_urlsafe(24))
        return True

    def check_post(self, request: Request, form: Any) -> None:
        """Refuse (403) a POST from another origin or without the session's CSRF token."""
        origin = request.headers.get("origin")
        if origin is not None and origin != _own_origin(request):
            raise HTTPException(403, f"refused: a POST from another origin ({origin})")
        if _bearer(request) is not None:
            return
        sent = form.get("csrf") or request.headers.get("x-csrf-token") or ""
        expected = request.session.get("csrf")
        if not isinstance(expected, str) or not _same(str(sent), expected):
            raise HTTPException(403, "refused: missing or wrong CSRF token (reload the page)")

    def check_action(self, request: Request) -> None:
        """Refuse (403) an action when actions are off, or when the request is not signed in."""
        if not self.actions:
            raise HTTPException(403, "read-only: this dashboard was started without --actions")
        if not self.token or not self.signed_in(request):
            raise HTTPException(403, "refused: sign in with the dashboard's token first")


def _own_origin(request: Request) -> str:
    host = request.headers.get("host", "")
    return f"{request.url.scheme}://{host}"
