"""Who may act, and how: read-only refuses every action (403), a token guards every page, a POST
needs the session's CSRF token and this dashboard's Origin, a replay signed in with the token works
and is logged, a Bearer token works for scripts, a non-loopback bind without a token is refused."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
from typing import Any

import pytest

import lbs
from lbs.dashboard import DashboardSettings
from lbs.deadletters import DeadLetters
from lbs.exceptions import ConfigurationError

from _dash import csrf
from _helpers import client, eventually, produce


async def _one_letter(url: str, service: str) -> str:
    """A dead letter of stream ``poison`` (a handler that always fails, no retries); its id."""

    async def handler(note: lbs.Notification) -> None:
        raise RuntimeError("poisoned")

    await produce(url, service, "poison")
    c = client(url, service, "w1", max_retries=0, retry_delay=0.0)
    worker = asyncio.create_task(c.run(handler))
    try:
        async with DeadLetters(url, service) as dlq:

            async def written() -> bool:
                return await dlq.count() == 1

            await eventually(written, 30)
            (letter,) = await dlq.list(1)
            return letter.id
    finally:
        await c.close()
        await worker


async def test_read_only_refuses_every_action(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    url = redis_server.url
    lid = await _one_letter(url, service)
    async with dashboard(url, [service]) as (http, _):
        page = (await http.get(f"/s/{service}/dead-letters/{lid}")).text
        token = csrf(page)
        for path in (
            f"/s/{service}/dead-letters/{lid}/replay",
            f"/s/{service}/dead-letters-all/purge",
        ):
            assert (await http.get(path)).status_code == 403
            resp = await http.post(path, data={"csrf": token})
            assert resp.status_code == 403 and "read-only" in resp.text
    async with DeadLetters(url, service) as dlq:
        assert await dlq.count() == 1


async def test_a_token_guards_pages_and_a_replay_needs_csrf_and_is_logged(
    redis_server: Any, service: str, dashboard: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_server.url
    lid = await _one_letter(url, service)
    replay = f"/s/{service}/dead-letters/{lid}/replay"
    async with dashboard(url, [service], actions=True, token="t0ken-for-tests") as (http, settings):
        assert not settings.token_generated
        resp = await http.get("/")
        assert resp.status_code == 303 and resp.headers["location"].startswith("/login")
        assert (await http.get("/api/status.json")).status_code == 401
        assert (await http.get("/events")).status_code == 401
        login = (await http.get("/login")).text
        wrong = await http.post("/login", data={"csrf": csrf(login), "token": "not-the-token"})
        assert wrong.status_code == 403
        no_csrf = await http.post("/login", data={"token": "t0ken-for-tests"})
        assert no_csrf.status_code == 403
        ok = await http.post("/login", data={"csrf": csrf(login), "token": "t0ken-for-tests"})
        assert ok.status_code == 303
        confirm = await http.get(replay)
        assert confirm.status_code == 200 and "Replay 1 dead letter?" in confirm.text
        token = csrf(confirm.text)
        assert (await http.post(replay, data={})).status_code == 403
        assert (await http.post(replay, data={"csrf": "forged"})).status_code == 403
        other = await http.post(
            replay, data={"csrf": token}, headers={"origin": "http://evil.example"}
        )
        assert other.status_code == 403 and "another origin" in other.text
        async with DeadLetters(url, service) as dlq:
            assert await dlq.count() == 1
        with caplog.at_level(logging.INFO, logger="lbs.dashboard"):
            done = await http.post(
                replay, data={"csrf": token}, headers={"origin": "http://127.0.0.1:8787"}
            )
        assert done.status_code == 303
        page = (await http.get(done.headers["location"])).text
        assert "replayed 1 letter(s) as " in page
        logged = [r.getMessage() for r in caplog.records if r.name == "lbs.dashboard"]
        assert any(
            re.search(rf"session \w+ from .*: replay {service} letter {lid}: replayed 1", m)
            for m in logged
        ), logged
    async with DeadLetters(url, service) as dlq:
        assert await dlq.count() == 0


async def test_a_bearer_token_acts_without_a_session(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    url = redis_server.url
    lid = await _one_letter(url, service)
    async with dashboard(url, [service], actions=True) as (http, settings):
        assert settings.token_generated and settings.token
        bearer = {"authorization": f"Bearer {settings.token}"}
        assert (await http.get("/api/status.json", headers=bearer)).status_code == 200
        resp = await http.post(
            f"/s/{service}/dead-letters-all/purge", headers=bearer, data={"until": lid}
        )
        assert resp.status_code == 303
        wrong = await http.post(
            f"/s/{service}/dead-letters-all/purge", headers={"authorization": "Bearer nope-nope"}
        )
        assert wrong.status_code == 401
    async with DeadLetters(url, service) as dlq:
        assert await dlq.count() == 0


def test_a_non_loopback_host_needs_a_token() -> None:
    with pytest.raises(ConfigurationError, match="not loopback"):
        DashboardSettings.make("redis://127.0.0.1:1", ["svc"], host="0.0.0.0")
    DashboardSettings.make("redis://127.0.0.1:1", ["svc"], host="0.0.0.0", token="long-enough")
    DashboardSettings.make("redis://127.0.0.1:1", ["svc"], host="::1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbs",
            "dashboard",
            "svc",
            "--url",
            "redis://:pw-secret@127.0.0.1:1",
            "--host",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "give a token" in proc.stderr and "pw-secret" not in proc.stderr


async def test_a_session_holds_across_replicas_with_the_same_token_and_ends_with_a_new_one(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    """Two replicas (or a restart) given the same token accept each other's session cookies; a
    replica given another token, or with a generated one, does not."""
    url = redis_server.url
    async with dashboard(url, [service], token="t0ken-for-tests") as (http, _):
        login = (await http.get("/login")).text
        ok = await http.post("/login", data={"csrf": csrf(login), "token": "t0ken-for-tests"})
        assert ok.status_code == 303 and (await http.get("/")).status_code == 200
        cookies = dict(http.cookies)
    for token, status in (("t0ken-for-tests", 200), ("another-t0ken", 303), (None, 303)):
        kw = {"token": token} if token else {"actions": True}  # None: a generated token
        async with dashboard(url, [service], **kw) as (other, _):
            other.cookies.update(cookies)
            assert (await other.get("/")).status_code == status, token
