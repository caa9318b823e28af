"""The dashboard's read-only pages against a real Redis and real lbs clients: each shows the right
numbers (waiting, held, consumers, held streams with their tokens, a search, dead letters with their
tracebacks, the recovery of an abandoned consumer), and a URL's password is never shown."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
import lbs.events
from lbs.embedded import RedisServer
from lbs.testing import abandon

from _dash import live
from _helpers import client, eventually, produce, take


async def test_overview_and_consumers_show_waiting_held_and_tokens(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    url = redis_server.url
    await produce(url, service, *[f"s{i}" for i in range(5)])
    c = client(url, service, "w1", max_streams=2)
    await c.start()
    try:
        held = await take(c, 2)
        async with dashboard(url, [service]) as (http, _):
            page = (await http.get("/")).text
            assert live(page, "waiting") == "3"
            assert live(page, "held") == "2"
            assert live(page, "alive") == "1"
            assert live(page, "dead") == "0"
            assert live(page, "dead_letters") == "0"
            assert f'id="svc-{service}"' in page
            assert "handled per minute" in page and "<svg" in page
            page = (await http.get(f"/s/{service}/consumers")).text
            assert "redis-consumer-w1" in page and "alive" in page
            for note in held:
                assert note.stream in page
                assert f">{note.token}<" in page  # the fencing token of each held stream
            doc = (await http.get("/api/status.json")).json()
            assert doc[service]["pending"] == 2 and doc[service]["backlog"] == 3
    finally:
        await c.close()


async def test_streams_search_finds_held_and_waiting_names(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    url = redis_server.url
    await produce(url, service, "order-1", "order-2", "invoice-9")
    c = client(url, service, "w1", max_streams=1)
    await c.start()
    try:
        (note,) = await take(c, 1)
        async with dashboard(url, [service]) as (http, _):
            page = (await http.get(f"/s/{service}/streams", params={"q": "ORDER"})).text
            assert "invoice-9" not in page
            rows = re.findall(
                r'<td class="name">([^<]+)</td><td><span class="badge[^"]*">([^<]+)<', page
            )
            names = ("order-1", "order-2", "invoice-9")
            expected = {
                (n, "held" if n == note.stream else "waiting") for n in names if "order" in n
            }
            assert set(rows) == expected
            page = (await http.get(f"/s/{service}/streams", params={"q": "nothing-like-it"})).text
            assert "No stream whose name contains" in page
    finally:
        await c.close()


async def test_streams_search_shows_a_delayed_publish_by_its_key(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    """A Publisher's delay= parks its messages in the parking stream: searched by key, not shown
    as a malformed registration."""
    url = redis_server.url
    await produce(url, service, "order-1")
    async with lbs.Publisher(url, service) as publisher:
        await publisher.publish("ticket-7", {"n": "1"}, delay=3600)
    async with dashboard(url, [service]) as (http, _):
        page = (await http.get(f"/s/{service}/streams", params={"q": "ticket"})).text
        rows = re.findall(
            r'<td class="name">([^<]+)</td><td><span class="badge[^"]*">([^<]+)<', page
        )
        assert rows == [("ticket-7", "parked (delayed messages)")]
        assert "(malformed)" not in page


async def test_dead_letters_list_filter_and_traceback(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    url = redis_server.url

    async def handler(note: lbs.Notification) -> None:
        raise ValueError(f"cannot handle {note.stream}")

    await produce(url, service, "bad-1", "bad-2")
    c = client(url, service, "w1", max_retries=0, retry_delay=0.0)
    worker = asyncio.create_task(c.run(handler, concurrency=2))
    try:
        async with dashboard(url, [service]) as (http, _):

            async def two_letters() -> bool:
                return live((await http.get("/")).text, "dead_letters") == "2"

            await eventually(two_letters, 30)
            page = (await http.get(f"/s/{service}/dead-letters")).text
            ids = re.findall(r'data-letter="([0-9-]+)"', page)
            assert len(ids) == 2 and "bad-1" in page and "bad-2" in page
            assert "Read-only" in page and "/replay" not in page
            page = (await http.get(f"/s/{service}/dead-letters", params={"reason": "nomatch"})).text
            assert 'data-letter="' not in page
            page = (await http.get(f"/s/{service}/dead-letters/{ids[0]}")).text
            assert 'class="traceback"' in page and "ValueError: cannot handle bad-" in page
            assert "Traceback (most recent call last)" in page
            missing = await http.get(f"/s/{service}/dead-letters/1-1")
            assert missing.status_code == 404
    finally:
        await c.close()
        await worker


async def test_recovery_shows_the_dead_holder_and_who_took_its_streams(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    url = redis_server.url
    await produce(url, service, "a", "b")
    dead = client(url, service, "gone", lock_ttl=0.5)
    await dead.start()
    await take(dead, 2)
    await abandon(dead)
    async with dashboard(url, [service]) as (http, _):

        async def shown_dead() -> bool:
            return live((await http.get("/")).text, "dead") == "1"

        await eventually(shown_dead, 20)
        page = (await http.get(f"/s/{service}/recovery")).text
        assert "redis-consumer-gone" in page and "wait for recovery" in page
        taker = client(url, service, "taker", lock_ttl=0.5, journal_interval=0.1)
        await taker.start()
        try:

            async def both_retaken() -> bool:
                page = (await http.get(f"/s/{service}/recovery")).text
                return page.count('class="recovered"') == 2 and "not yet" not in page

            await eventually(both_retaken, 30)
            page = (await http.get(f"/s/{service}/recovery")).text
            assert '<span class="badge dead">dead</span> redis-consumer-gone' in page
            assert "declared dead by redis-consumer-taker" in page
            assert page.count("redis-consumer-taker at ") == 2
        finally:
            await taker.close()


async def test_a_url_password_is_never_shown(
    redis_server: Any, r: aioredis.Redis, service: str, dashboard: Any
) -> None:
    secret = "s3cret-Passw0rd-xyz"
    await r.execute_command("ACL", "SETUSER", "dash", "on", f">{secret}", "~*", "&*", "+@all")
    host = redis_server.url.split("://", 1)[1].rstrip("/")
    url = f"redis://dash:{secret}@{host}"
    await produce(url, service, "x")
    async with dashboard(url, [service]) as (http, _):
        for path in (
            "/",
            f"/s/{service}/consumers",
            f"/s/{service}/dead-letters",
            "/api/status.json",
        ):
            resp = await http.get(path)
            assert resp.status_code == 200, path
            assert secret not in resp.text, path
        assert "dash:***@" in (await http.get("/")).text
    wrong = f"redis://dash:wrong-{secret}@{host}"
    async with dashboard(wrong, [service]) as (http, _):
        resp = await http.get("/")
        assert resp.status_code == 503
        assert "cannot read Redis" in resp.text and secret not in resp.text


async def test_an_unknown_service_is_404(redis_server: Any, service: str, dashboard: Any) -> None:
    async with dashboard(redis_server.url, [service]) as (http, _):
        assert (await http.get("/s/not-mine/consumers")).status_code == 404
        assert (await http.get("/no/such/page")).status_code == 404


def _listed_row(page: str, service: str) -> str:
    """The row of ``service`` in the home page's list of the services on the Redis."""
    listing = page.split('id="services-list"', 1)[1]
    m = re.search(rf'<tr data-listed="{re.escape(service)}">(.*?)</tr>', listing, re.S)
    assert m, listing
    return m.group(1)


async def test_the_home_page_lists_the_services_on_the_redis(service: str, dashboard: Any) -> None:
    """Every service there is, with its waiting, held, consumers and dead letters; the ones this
    dashboard shows linked to their pages, the others with the command that shows them. On a Redis
    of its own: the session's shared one holds more services than the page lists."""
    with RedisServer() as own:
        await _home_page_lists(own.url, service, dashboard)


async def test_the_home_page_lists_the_dashboards_own_services_first(
    service: str, dashboard: Any
) -> None:
    """Past the first 50 services by name, the dashboard's own are still listed (first)."""
    with RedisServer() as own:
        r = aioredis.Redis.from_url(own.url)
        for i in range(55):
            await r.xadd(lbs.input_stream(f"a{i:02d}"), {"lbs-input": lbs.encode_input("x")})
        await produce(own.url, "zz-" + service, "s1")
        async with dashboard(own.url, ["zz-" + service]) as (http, _):
            page = (await http.get("/")).text
        await r.aclose()
    listing = page.split('id="services-list"', 1)[1]
    listed = re.findall(r'<tr data-listed="([^"]+)">', listing)
    assert listed[0] == "zz-" + service and len(listed) == 50
    assert "the first 50 of 56" in listing


async def _home_page_lists(url: str, service: str, dashboard: Any) -> None:
    r = aioredis.Redis.from_url(url)
    shown, other = service + "-shown", service + "-other"
    await produce(url, shown, "s1")
    await produce(url, other, "o1", "o2")
    await r.xadd(lbs.dead_letter_stream(other), {"lbs-input": "{bad", "_reason": "test"})
    c = client(url, other, "w1", max_streams=1)
    await c.start()
    try:
        await take(c, 1)
        async with dashboard(url, [shown]) as (http, _):
            page = (await http.get("/")).text
    finally:
        await c.close()
    row = _listed_row(page, shown)
    assert f'<a href="/s/{shown}/consumers">{shown}</a>' in row
    assert re.search(r'data-col="waiting">1<', row) and re.search(r'data-col="held">0<', row)
    row = _listed_row(page, other)
    assert f"lbs dashboard {other}" in row and f"/s/{other}/" not in row
    assert re.search(r'data-col="waiting">1<', row) and re.search(r'data-col="held">1<', row)
    assert "1 alive" in row and re.search(r'data-col="dead_letters">1<', row)
    await r.aclose()


@pytest.mark.cluster
async def _every_page_with_a_dead_letter(url: str, service: str, dashboard: Any, why: str) -> str:
    """One stream handled, one dead-lettered with ``why``: every page answers; the overview's text."""

    async def handler(note: lbs.Notification) -> None:
        if note.stream == "bad":
            raise ValueError(why)

    await produce(url, service, "good", "bad")
    c = client(url, service, "w1", max_retries=0, retry_delay=0.0, journal_interval=0.1)
    worker = asyncio.create_task(c.run(handler))
    try:
        async with dashboard(url, [service]) as (http, _):

            async def handled() -> bool:
                page = (await http.get("/")).text
                return live(page, "dead_letters") == "1" and live(page, "done_hour") == "1"

            await eventually(handled, 30)
            for path in ("consumers", "streams?q=o", "recovery", "dead-letters", "failures"):
                assert (await http.get(f"/s/{service}/{path}")).status_code == 200, path
            page = (await http.get(f"/s/{service}/dead-letters")).text
            assert why in page
            return (await http.get("/")).text
    finally:
        await c.close()
        await worker


async def test_a_service_on_a_cluster(redis_cluster: Any, service: str, dashboard: Any) -> None:
    url = redis_cluster.url.replace("redis://", "redis+cluster://", 1)
    await _every_page_with_a_dead_letter(url, service, dashboard, "bad on a cluster")


async def test_a_service_on_valkey_names_it(
    valkey_server: Any, service: str, dashboard: Any
) -> None:
    """Valkey 9.1 (no XACKDEL, MSETEX: the fallbacks; it answers INFO as Redis 7.2.4): every page, the
    tallies and a dead letter, and the header names Valkey by its own version."""
    page = await _every_page_with_a_dead_letter(
        valkey_server.url, service, dashboard, "bad on valkey"
    )
    assert valkey_server.name in page and "Redis 7.2" not in page


async def test_consumers_show_the_metrics_their_process_serves(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    """A worker with lbs-prometheus serving announces its /metrics URL in the journal; the
    consumers page reads it and shows that consumer's own values; one that cannot be reached says so."""
    prometheus = pytest.importorskip("lbs_prometheus")
    from prometheus_client import CollectorRegistry

    plugin = prometheus.PrometheusPlugin(port=0, addr="127.0.0.1", registry=CollectorRegistry())
    url = redis_server.url
    await produce(url, service, "s1")
    c = client(url, service, "w1", plugins=[plugin])
    await c.start()
    try:
        await take(c, 1)
        served = f"http://127.0.0.1:{plugin.port}/metrics"

        async def announced() -> bool:
            events = await lbs.events.read_events(url, service, kinds=["started"])
            return any(e.fields.get("metrics") == served for e in events)

        await eventually(announced, timeout=30)
        async with dashboard(url, [service]) as (http, _):
            page = (await http.get(f"/s/{service}/consumers")).text
            assert 'data-metrics="redis-consumer-w1"' in page and served in page
            held = re.search(
                r'lbs_held_streams</td><td class="muted">[^<]*</td><td class="num mono">(\d+)<',
                page,
            )
            assert held is not None and held.group(1) == "1", page  # the one stream it holds
        plugin.close()  # the process stops serving: the page says why it shows nothing
        async with dashboard(url, [service]) as (http, _):
            page = (await http.get(f"/s/{service}/consumers")).text
            assert served in page and "URLError" in page
    finally:
        await c.close()
        plugin.close()


async def test_failures_show_each_failed_attempt_with_its_traceback(
    redis_server: Any, service: str, dashboard: Any
) -> None:
    """A handler failing is diagnosable before any dead letter: each attempt, its reason and
    traceback, from the journal; filtered by stream name."""
    url = redis_server.url

    async def handler(note: lbs.Notification) -> None:
        if note.stream.startswith("flaky") and note.retry_count < 2:
            raise KeyError(f"attempt {note.retry_count} of {note.stream}")

    await produce(url, service, "flaky-1", "steady-1")
    c = client(url, service, "w1", retry_delay=0.0)
    worker = asyncio.create_task(c.run(handler))
    try:
        await c.wait_finished(2, timeout=60)
        async with dashboard(url, [service]) as (http, _):

            async def both_attempts() -> bool:
                page = (await http.get(f"/s/{service}/failures")).text
                return page.count('data-failure="') == 2

            await eventually(both_attempts, 30)
            page = (await http.get(f"/s/{service}/failures")).text
            assert "attempt 1 of flaky-1" in page and "attempt 0 of flaky-1" in page
            assert page.index("attempt 1 of") < page.index("attempt 0 of")  # newest first
            assert "Traceback (most recent call last)" in page and "steady-1" not in page
            page = (await http.get(f"/s/{service}/failures", params={"q": "STEADY"})).text
            assert 'data-failure="' not in page and "No failure in the last hour" in page
    finally:
        await c.close()
        await worker
