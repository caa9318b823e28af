"""An operator's hands on live work from the dashboard: pause and resume a service (the pause key
and the journal's ``paused``/``resumed``, the banner), release, cancel and force-claim a stream held
by a running consumer; each behind the same guard as the dead-letter actions (``--actions``, the
token's sign-in, CSRF), logged, and a bad entry id or action is a 404."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

import lbs
from lbs import _keys
from lbs.deadletters import DeadLetters
from lbs.events import read_events

from _dash import csrf
from _helpers import client, eventually, produce

TOKEN = "t0ken-for-tests"
ORIGIN = {"origin": "http://127.0.0.1:8787"}


async def _sign_in(http: httpx.AsyncClient) -> None:
    login = (await http.get("/login")).text
    ok = await http.post("/login", data={"csrf": csrf(login), "token": TOKEN})
    assert ok.status_code == 303


async def _flash(http: httpx.AsyncClient, resp: httpx.Response) -> str:
    """The flash message of the page a POST redirected to."""
    assert resp.status_code == 303, resp.text
    page = (await http.get(resp.headers["location"])).text
    m = re.search(r'<p class="flash (\w+)" role="status">([^<]*)</p>', page)
    assert m, page
    return f"{m.group(1)}: {m.group(2)}"


@asynccontextmanager
async def _holding(url: str, service: str, *names: str) -> AsyncIterator[list[str]]:
    """A consumer running a handler that never ends, holding ``names``; their entry ids."""
    ids = await produce(url, service, *names)

    async def handler(note: lbs.Notification) -> None:
        await asyncio.Event().wait()

    c = client(url, service, "w1")
    worker = asyncio.create_task(c.run(handler))
    try:
        r = aioredis.Redis.from_url(url)
        try:

            async def held() -> bool:
                try:
                    info = await r.xpending(_keys.input_stream(service), _keys.group_name(service))
                except ResponseError:  # NOGROUP: the consumer has not made the group yet
                    return False
                return int(info["pending"]) == len(names)

            await eventually(held, 30)
        finally:
            await r.aclose()
        yield ids
    finally:
        await c.close()
        await worker


async def test_pause_then_resume_writes_the_key_the_journal_and_the_banner(
    redis_server: Any, service: str, dashboard: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_server.url
    await produce(url, service, "s-1")
    r = aioredis.Redis.from_url(url, decode_responses=True)
    key = _keys.paused_key(service)
    async with dashboard(url, [service], actions=True, token=TOKEN) as (http, _):
        await _sign_in(http)
        page = (await http.get(f"/s/{service}/streams")).text
        assert f'href="/s/{service}/pause?next=' in page and "paused-banner" not in page
        confirm = await http.get(f"/s/{service}/pause?next=/s/{service}/streams")
        assert confirm.status_code == 200 and f"Pause {service}?" in confirm.text
        with caplog.at_level(logging.INFO, logger="lbs.dashboard"):
            done = await http.post(
                f"/s/{service}/pause",
                data={"csrf": csrf(confirm.text), "reason": "migrating", "next": "/s/x/streams"},
                headers=ORIGIN,
            )
        assert done.headers["location"] == "/s/x/streams"  # where it came from, never elsewhere
        assert await r.hget(key, "reason") == "migrating"
        by = await r.hget(key, "by")
        assert by and re.fullmatch(r"dashboard \(session \w+ from .+\)", by), by
        page = (await http.get(f"/s/{service}/consumers")).text
        assert f"{service}: paused: migrating" in page
        assert "paused-banner" in page and f"paused (by {by} since " in page
        assert f'href="/s/{service}/resume?next=' in page
        assert f'href="/s/{service}/pause?next=' not in page
        confirm = await http.get(f"/s/{service}/resume")
        assert f"Resume {service}?" in confirm.text
        with caplog.at_level(logging.INFO, logger="lbs.dashboard"):
            done = await http.post(
                f"/s/{service}/resume", data={"csrf": csrf(confirm.text)}, headers=ORIGIN
            )
        assert f"{service}: resumed (paused by {by} since " in await _flash(http, done)
        assert not await r.exists(key)
        page = (await http.get(f"/s/{service}/consumers")).text
        assert "paused-banner" not in page
        # Resumed: the confirmation page has nothing to resume.
        assert "is not paused." in (await http.get(f"/s/{service}/resume")).text
    await r.aclose()
    events = await read_events(url, service, kinds=["paused", "resumed"])
    assert [(e.kind, e.fields.get("by")) for e in events] == [("paused", by), ("resumed", by)]
    assert events[0].fields["reason"] == "migrating"
    logged = [m.getMessage() for m in caplog.records if m.name == "lbs.dashboard"]
    assert any(
        re.search(rf"session \w+ from .*: pause {service} \(reason 'migrating'\): paused", m)
        for m in logged
    ), logged
    assert any(re.search(rf": resume {service}: resumed \(paused by ", m) for m in logged), logged


async def test_controls_are_refused_without_actions_sign_in_or_csrf(
    redis_server: Any, service: str, dashboard: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_server.url
    await produce(url, service, "s-1")
    paths = [f"/s/{service}/pause", f"/s/{service}/resume"]
    paths += [f"/s/{service}/streams/1-0/{a}" for a in ("release", "cancel", "force-claim")]
    async with dashboard(url, [service]) as (http, _):  # read-only
        page = await http.get(f"/s/{service}/streams")
        assert "pause…" not in page.text
        for path in paths:
            assert (await http.get(path)).status_code == 403, path
            resp = await http.post(path, data={"csrf": csrf(page.text)})
            assert resp.status_code == 403 and "read-only" in resp.text, path
    async with dashboard(url, [service], actions=True, token=TOKEN) as (http, _):
        for path in paths:  # not signed in
            assert (await http.get(path)).status_code == 303, path
            assert (await http.post(path, data={})).status_code == 401, path
        await _sign_in(http)
        with caplog.at_level(logging.INFO, logger="lbs.dashboard"):
            for path in paths:
                assert (await http.post(path, data={})).status_code == 403, path
                assert (await http.post(path, data={"csrf": "forged"})).status_code == 403, path
    r = aioredis.Redis.from_url(url)
    try:
        assert not await r.exists(_keys.paused_key(service))
    finally:
        await r.aclose()
    assert await read_events(url, service, kinds=["paused", "resumed", "force_claimed"]) == []
    logged = [m.getMessage() for m in caplog.records if m.name == "lbs.dashboard"]
    assert any(f"pause {service} refused: missing or wrong CSRF" in m for m in logged), logged


async def test_release_cancel_and_force_claim_a_stream_held_by_a_running_consumer(
    redis_server: Any, service: str, dashboard: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_server.url
    async with (
        _holding(url, service, "s-release", "s-cancel", "s-force") as (one, two, three),
        dashboard(url, [service], actions=True, token=TOKEN) as (http, _),
    ):
        await _sign_in(http)
        page = (await http.get(f"/s/{service}/streams")).text
        for eid in (one, two, three):
            for action in ("release", "cancel", "force-claim"):
                assert f'href="/s/{service}/streams/{eid}/{action}"' in page
        confirm = await http.get(f"/s/{service}/streams/{one}/release")
        assert confirm.status_code == 200 and f"Release entry {one}?" in confirm.text
        assert "s-release" in confirm.text and "redis-consumer-w1" in confirm.text
        token = csrf(confirm.text)
        with caplog.at_level(logging.INFO, logger="lbs.dashboard"):
            released = await http.post(
                f"/s/{service}/streams/{one}/release", data={"csrf": token}, headers=ORIGIN
            )
            assert re.fullmatch(
                rf"ok: {service}: released {one} as \d+-\d+", await _flash(http, released)
            )
            cancelled = await http.post(
                f"/s/{service}/streams/{two}/cancel",
                data={"csrf": token, "reason": "bad input"},
                headers=ORIGIN,
            )
            assert re.fullmatch(
                rf"ok: {service}: cancelled {two}: dead letter \d+-\d+",
                await _flash(http, cancelled),
            )
            forced = await http.post(
                f"/s/{service}/streams/{three}/force-claim", data={"csrf": token}, headers=ORIGIN
            )
            assert re.fullmatch(
                rf"ok: {service}: force-claimed {three} as \d+-\d+ \(retry 1\)",
                await _flash(http, forced),
            )
            gone = await http.post(
                f"/s/{service}/streams/{one}/release", data={"csrf": token}, headers=ORIGIN
            )
            assert await _flash(http, gone) == f"warn: {service}: {one}: not held (not pending)"
        assert "is not held now" in (await http.get(f"/s/{service}/streams/{one}/cancel")).text
        for bad in (f"/s/{service}/streams/nope/release", f"/s/{service}/streams/{one}/frob"):
            assert (await http.get(bad)).status_code == 404, bad
            assert (await http.post(bad, data={"csrf": token})).status_code == 404, bad
    async with DeadLetters(url, service) as dlq:
        (letter,) = await dlq.list(10)
        assert "bad input" in letter.reason
    kinds = [e.kind for e in await read_events(url, service, kinds=["released", "cancelled"])]
    assert sorted(kinds) == ["cancelled", "released"]
    logged = [m.getMessage() for m in caplog.records if m.name == "lbs.dashboard"]
    assert any(f": release {service} entry {one}: released {one} as " in m for m in logged)
    assert any(
        f": cancel {service} entry {two} (reason 'bad input'): cancelled {two}" in m for m in logged
    ), logged


async def test_a_pause_key_of_another_type_shows_as_a_pause(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    """A pause key of another type is a pause (consumers count it): the banner says so."""
    url = redis_server.url
    await produce(url, service, "s-1")
    r = aioredis.Redis.from_url(url)
    try:
        await r.set(_keys.paused_key(service), "yes")
        async with dashboard(url, [service]) as (http, _):
            page = (await http.get(f"/s/{service}/consumers")).text
            assert "paused (by ?: " in page and "holds a string" in page
    finally:
        await r.delete(_keys.paused_key(service))
        await r.aclose()
