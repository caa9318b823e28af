"""Fixtures of tests/dashboard: the dashboard's ASGI app driven in-process (httpx over ASGI, in the
test's event loop) against the session's real Redis; ``journal_quick`` makes consumers flush their
journal every 50 ms."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from lbs.dashboard import DashboardSettings, create_app

# tests/integration's _helpers (client, produce, take, eventually), for the test modules here.
sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))

Open = Callable[..., AbstractAsyncContextManager[tuple[httpx.AsyncClient, DashboardSettings]]]


@pytest.fixture(autouse=True)
def journal_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        from lbs._consumer import journal
    except ImportError:  # a tree without the journal: nothing to hurry
        return
    monkeypatch.setattr(journal, "FLUSH_EVERY", 0.05)


@pytest.fixture
def dashboard() -> Open:
    """``async with dashboard(url, [services], **settings) as (http, settings)``: the app served
    in-process (its lifespan run), an httpx client on it."""

    @asynccontextmanager
    async def open_(
        url: str, services: list[str], **kw: Any
    ) -> AsyncIterator[tuple[httpx.AsyncClient, DashboardSettings]]:
        settings = DashboardSettings.make(url, services, **kw)
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1:8787"
            ) as http:
                yield http, settings

    return open_
