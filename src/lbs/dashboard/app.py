"""The dashboard's ASGI application: :func:`create_app` builds the Starlette app of one
:class:`DashboardSettings` (routes, session cookie, templates, static files, the live hub).

The read-only pages are :mod:`lbs.dashboard.pages`, the actions (sign-in, replay, purge)
:mod:`lbs.dashboard.actions`, an operator's hands on live work (pause, resume, release, cancel,
force-claim) :mod:`lbs.dashboard.controls`, the live stream :mod:`lbs.dashboard.live`. Every page
is rendered on the server and works without JavaScript; the script only applies the live snapshots
and asks before an action.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from _lbscore import try_decode_input

from .. import __version__
from .._urlmask import mask_secrets
from ..cli._common import duration
from ..exceptions import LbsError
from .data import Fleet, read_pause
from .live import Hub, TallyWindow, live_snapshot
from .security import Guard, csrf_token
from .settings import DashboardSettings

__all__ = ["Dashboard", "create_app", "page"]

HERE = Path(__file__).parent
Endpoint = Callable[[Request], Awaitable[Response]]


def _stream_name(raw: str) -> str:
    """The data stream name an ``lbs-input`` value registers ("(undecodable)" when none)."""
    name, _, _ = try_decode_input(raw)
    return name if name is not None else "(undecodable)"


def _clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000))


class Dashboard:
    """What every route shares: the settings, the fleet's client, the guard, the hub, the templates."""

    def __init__(self, settings: DashboardSettings) -> None:
        self.settings = settings
        self.fleet = Fleet(settings.url, settings.shown_services, settings.config)
        self.guard = Guard(settings.token, settings.actions)
        self.windows: dict[str, TallyWindow] = {}
        self.hub = Hub(lambda: live_snapshot(self.fleet, self.windows), settings.refresh)
        self.templates = Jinja2Templates(directory=str(HERE / "templates"))
        env = self.templates.env
        env.filters["dur"] = duration
        env.filters["clock"] = _clock
        env.filters["stream_name"] = _stream_name
        env.globals["settings"] = settings
        env.globals["version"] = __version__

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        """Template ``name`` with what every page shows (services, mode, CSRF token, flash messages)."""
        flash = request.session.pop("flash", []) if "session" in request.scope else []
        ctx = {
            "services": self.fleet.services,
            "csrf": csrf_token(request),
            "signed_in": self.guard.signed_in(request),
            "can_act": self.guard.actions and bool(self.guard.token),
            "flash": flash,
            "refresh_ms": int(self.settings.refresh * 1000),
            "paused": getattr(request.state, "paused", None),
            **context,
        }
        response = self.templates.TemplateResponse(request, name, ctx, status_code=status)
        response.headers["cache-control"] = "no-store"
        return response

    def error(self, request: Request, status: int, message: str) -> Response:
        return self.render(
            request, "error.html", {"status": status, "message": message}, status=status
        )

    def masked(self, exc: BaseException) -> str:
        """An error's text with the Redis URL's secrets hidden."""
        return mask_secrets(self.settings.url, str(exc))


def dash(request: Request) -> Dashboard:
    d: Dashboard = request.app.state.dashboard
    return d


def page(endpoint: Endpoint) -> Endpoint:
    """A route of the dashboard: signed in (else to the login form), a known service (else 404; a
    GET reads its pause, for the banner), and a Redis failure shown as a page saying so (503), its
    URL's password masked."""

    @functools.wraps(endpoint)
    async def wrapped(request: Request) -> Response:
        d = dash(request)
        if not d.guard.signed_in(request):
            scripted = "authorization" in request.headers or request.method != "GET"
            if scripted or request.url.path.startswith(("/api/", "/events")):
                return Response("sign in first\n", status_code=401, media_type="text/plain")
            return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
        service = request.path_params.get("service")
        if service is not None and service not in d.fleet.services:
            return d.error(request, 404, f"this dashboard does not show a service {service!r}")
        if service is not None and request.method == "GET":  # a service's page: its pause banner
            request.state.paused = await read_pause(d.fleet.client, service)
        try:
            return await endpoint(request)
        except HTTPException as exc:
            return d.error(request, exc.status_code, str(exc.detail))
        except (LbsError, RedisError, OSError) as exc:
            return d.error(request, 503, f"cannot read Redis: {d.masked(exc)}")

    return wrapped


def create_app(settings: DashboardSettings) -> Starlette:
    """The Starlette application of ``settings`` (serve it with uvicorn; ``lbs dashboard`` does)."""
    from . import actions, controls, pages

    d = Dashboard(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await d.hub.close()
            await d.fleet.aclose()

    routes = [
        *pages.routes(),
        *actions.routes(),
        *controls.routes(),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(
                SessionMiddleware,
                secret_key=settings.secret_key,
                session_cookie="lbs_dashboard",
                same_site="strict",
                https_only=False,
            )
        ],
        exception_handlers={404: _not_found},
    )
    app.state.dashboard = d
    return app


async def _not_found(request: Request, exc: Exception) -> Response:
    return dash(request).error(request, 404, "no such page")


Routes = list[Route]
