"""``lbs dashboard`` in a real browser (Debian's chromium under Playwright) against a real Redis and
a fleet of ``lbs worker`` processes: the pages render, the live counters move while work is done
(no reload), a consumer killed with SIGKILL shows as dead and its streams as recovered (who took
them), and a dead letter is shown with its traceback, replayed from the page and then processed.

Waits are bounded: Playwright's ``expect`` and ``wait_for_function`` (30-60 s), never a sleep
followed by an assertion on timing.
"""

from __future__ import annotations

import asyncio
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import lbs

from _browser import HANDLERS, shoot, wait_until

expect = pytest.importorskip("playwright.sync_api", reason="pip install playwright").expect

WORKER = ("--lock-ttl", "2", "--set", "journal_interval=0.5", "--set", "read_block=0.2")


def produce(url: str, service: str, *names: str) -> None:
    async def go() -> None:
        async with lbs.Producer(url, service) as producer:
            await producer.add_streams(list(names))

    # Playwright's sync API runs an event loop in this thread: the producer runs in another.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result(timeout=60)


def handled(log: Path, event: str = "done") -> list[str]:
    return [
        line.split()[2] for line in log.read_text().splitlines() if line.startswith(event + " ")
    ]


def sign_in(page: Any, base: str, token: str) -> None:
    page.goto(f"{base}/login")
    page.get_by_label("token").fill(token)
    page.get_by_role("button", name="sign in").click()
    expect(page.locator("header.top .mode")).to_have_text("actions on")


def counter(page: Any, service: str, field: str) -> Any:
    return page.locator(f'[data-service="{service}"] [data-live="{field}"]')


def test_live_counters_move_while_work_is_done(
    page: Any, redis_server: Any, names: Any, start_dashboard: Any, lbs_proc: Any, log: Path
) -> None:
    url = redis_server.url
    service, other = names("orders"), names("invoices")
    jobs = [f"order-{i:03d}" for i in range(120)]
    produce(url, service, *jobs)
    produce(url, other, *[f"invoice-{i}" for i in range(7)])
    dash = start_dashboard(url, service, other)
    sign_in(page, dash.base, dash.token)
    page.goto(dash.base + "/")
    expect(page.locator("header.top")).to_contain_text(service)
    expect(counter(page, service, "waiting")).to_have_text(str(len(jobs)))
    expect(counter(page, other, "waiting")).to_have_text("7")
    expect(counter(page, service, "alive")).to_have_text("0")
    # The home page lists the services on this Redis, each linked to its pages.
    listed = page.locator(f'#services-list tr[data-listed="{other}"]')
    expect(listed.locator('[data-col="waiting"]')).to_have_text("7")
    expect(listed.get_by_role("link", name=other)).to_have_attribute(
        "href", f"/s/{other}/consumers"
    )
    page.evaluate("window.__sameDocument = true")  # gone if the page were reloaded
    worker = lbs_proc(
        "worker",
        f"{HANDLERS}:work",
        "--service",
        service,
        "--url",
        url,
        "--consumer-id",
        "orders-1",
        "--concurrency",
        "4",
        *WORKER,
        LBS_TEST_WORK="0.25",
    )
    # Live, without a reload: the consumer appears, the backlog drains, the tallies reach the chart.
    expect(counter(page, service, "alive")).to_have_text("1", timeout=60_000)
    page.wait_for_function(
        f"""() => {{
            const n = (f) => Number(document.querySelector('[data-service="{service}"] [data-live="' + f + '"]').textContent);
            const bars = document.querySelectorAll('[data-service="{service}"] svg.chart-done rect.bar');
            const drawn = Array.from(bars).some((b) => Number(b.getAttribute("height")) > 0);
            return n("held") > 0 && n("done_hour") > 0 && drawn;
        }}""",
        timeout=60_000,
    )
    shoot(page, "overview")  # mid-work: streams held, the first tallies charted
    expect(counter(page, service, "waiting")).to_have_text("0", timeout=60_000)
    wait_until(lambda: len(handled(log)) == len(jobs), "every job handled", 120)
    expect(counter(page, service, "held")).to_have_text("0", timeout=30_000)
    expect(counter(page, service, "done_hour")).to_have_text(str(len(jobs)), timeout=30_000)
    assert page.evaluate("window.__sameDocument") is True
    bars = page.locator(
        f'[data-service="{service}"] svg.chart-done rect.bar[height]:not([height="0.0"])'
    )
    expect(bars.first).to_be_visible()
    assert worker.popen.poll() is None, worker.err()


def test_a_killed_consumer_is_dead_and_its_streams_recovered(
    page: Any, redis_server: Any, names: Any, start_dashboard: Any, lbs_proc: Any, log: Path
) -> None:
    url, service = redis_server.url, names("payments")
    victims = ["payment-7f3a", "payment-81c0", "payment-9d42"]
    produce(url, service, *victims)
    dash = start_dashboard(url, service)
    sign_in(page, dash.base, dash.token)
    holder = lbs_proc(
        "worker",
        f"{HANDLERS}:hold",
        "--service",
        service,
        "--url",
        url,
        "--consumer-id",
        "pay-1",
        *WORKER,
    )
    wait_until(lambda: len(handled(log, "started")) == 3, "the holder holds the three streams")
    page.goto(f"{dash.base}/s/{service}/consumers")
    doomed = page.locator('[data-consumer="redis-consumer-pay-1"]')
    expect(doomed.locator(".badge")).to_have_text("alive")
    for name in victims:
        expect(doomed.locator("td.name", has_text=name)).to_be_visible()
    holder.popen.send_signal(signal.SIGKILL)
    holder.popen.wait(timeout=30)
    page.goto(dash.base + "/")
    expect(counter(page, service, "dead")).to_have_text("1", timeout=60_000)
    page.goto(f"{dash.base}/s/{service}/consumers")
    expect(doomed.locator(".badge")).to_have_text("dead")
    shoot(page, "consumers")
    lbs_proc(
        "worker",
        f"{HANDLERS}:work",
        "--service",
        service,
        "--url",
        url,
        "--consumer-id",
        "pay-2",
        *WORKER,
    )
    wait_until(lambda: sorted(handled(log)) == victims, "the rescuer handled the three streams", 90)

    def timeline_complete() -> bool:
        page.goto(f"{dash.base}/s/{service}/recovery")
        rows = page.locator("tr.recovered")
        return rows.count() == 3 and page.locator("tr.recovered", has_text="not yet").count() == 0

    wait_until(timeline_complete, "the recovery timeline shows the three streams taken again", 60)
    incident = page.locator("li.incident").first
    expect(incident.locator("h3")).to_contain_text("redis-consumer-pay-1")
    expect(incident).to_contain_text("declared dead by redis-consumer-pay-2")
    for name in victims:
        row = page.locator("tr.recovered", has_text=name)
        expect(row).to_contain_text("redis-consumer-pay-2 at")
    shoot(page, "recovery")


def test_a_dead_letter_is_replayed_from_the_page_and_processed(
    page: Any,
    redis_server: Any,
    names: Any,
    start_dashboard: Any,
    lbs_proc: Any,
    log: Path,
    tmp_path: Path,
) -> None:
    url, service = redis_server.url, names("emails")
    flag = tmp_path / "fail.flag"
    flag.touch()
    # Before the dashboard starts: it refuses a service that is not there.
    produce(url, service, "poison-1")
    dash = start_dashboard(url, service)
    lbs_proc(
        "worker",
        f"{HANDLERS}:flaky",
        "--service",
        service,
        "--url",
        url,
        "--consumer-id",
        "emails-1",
        "--max-retries",
        "1",
        "--set",
        "retry_delay=0.1",
        *WORKER,
        LBS_TEST_FAIL_FLAG=str(flag),
    )
    sign_in(page, dash.base, dash.token)
    page.goto(dash.base + "/")
    expect(counter(page, service, "dead_letters")).to_have_text("1", timeout=60_000)
    page.goto(f"{dash.base}/s/{service}/dead-letters")
    row = page.locator("tr[data-letter]", has_text="poison-1")
    expect(row.locator("td.reason")).to_contain_text("RuntimeError")
    row.locator("td.mono a").click()
    traceback = page.locator("pre.traceback")
    expect(traceback).to_contain_text("Traceback (most recent call last)")
    expect(traceback).to_contain_text("RuntimeError: poison-1: refused while the flag file is set")
    shoot(page, "dead-letter")
    flag.unlink()  # the handler succeeds from now on
    page.get_by_role("link", name="replay…").click()
    expect(page.locator("h1")).to_have_text("Replay 1 dead letter?")
    page.get_by_role("button", name="replay 1").click()
    expect(page.locator(".flash")).to_contain_text("replayed 1 letter(s)")
    wait_until(lambda: handled(log) == ["poison-1"], "the replayed stream handled", 60)
    page.goto(dash.base + "/")
    expect(counter(page, service, "dead_letters")).to_have_text("0")


def test_a_service_is_paused_and_resumed_from_the_page(
    page: Any, redis_server: Any, names: Any, start_dashboard: Any
) -> None:
    url, service = redis_server.url, names("billing")
    produce(url, service, "bill-1")
    dash = start_dashboard(url, service)
    sign_in(page, dash.base, dash.token)
    page.goto(f"{dash.base}/s/{service}/consumers")
    banner = page.locator(".paused-banner")
    expect(banner).to_have_count(0)
    page.get_by_role("link", name="pause…").click()
    expect(page.locator("h1")).to_have_text(f"Pause {service}?", timeout=20_000)
    page.get_by_label("reason (optional)").fill("migrating the database")
    page.get_by_role("button", name=f"pause {service}").click()
    expect(page.locator(".flash")).to_have_text(
        f"{service}: paused: migrating the database", timeout=20_000
    )
    expect(banner).to_contain_text("paused (by dashboard (session ", timeout=20_000)
    expect(banner).to_contain_text(": migrating the database)")
    assert page.url.endswith(f"/s/{service}/consumers")
    banner.get_by_role("link", name="resume…").click()
    expect(page.locator("h1")).to_have_text(f"Resume {service}?", timeout=20_000)
    page.get_by_role("button", name=f"resume {service}").click()
    expect(page.locator(".flash")).to_contain_text(f"{service}: resumed (paused by dashboard")
    expect(banner).to_have_count(0, timeout=20_000)
    expect(page.get_by_role("link", name="pause…")).to_be_visible()


def test_a_held_stream_is_released_from_the_streams_page(
    page: Any, redis_server: Any, names: Any, start_dashboard: Any, lbs_proc: Any, log: Path
) -> None:
    url, service = redis_server.url, names("exports")
    produce(url, service, "export-42")
    dash = start_dashboard(url, service)
    lbs_proc(
        "worker",
        f"{HANDLERS}:hold",
        "--service",
        service,
        "--url",
        url,
        "--consumer-id",
        "exp-1",
        *WORKER,
    )
    wait_until(lambda: handled(log, "started") == ["export-42"], "the holder holds the stream")
    sign_in(page, dash.base, dash.token)
    page.goto(f"{dash.base}/s/{service}/streams")
    row = page.locator("tr[data-held]", has_text="export-42")
    expect(row).to_have_count(1, timeout=20_000)
    entry_id = row.get_attribute("data-held")
    row.get_by_role("link", name="release").click()
    expect(page.locator("h1")).to_have_text(f"Release entry {entry_id}?", timeout=20_000)
    expect(page.locator("table.grid")).to_contain_text("redis-consumer-exp-1")
    page.get_by_role("button", name=f"release {entry_id}").click()
    expect(page.locator(".flash")).to_contain_text(
        f"{service}: released {entry_id} as ", timeout=20_000
    )
    # Handed back with no retry counted: the only consumer takes it again, under a new entry.
    wait_until(
        lambda: handled(log, "started") == ["export-42", "export-42"], "the stream taken again", 20
    )
    assert log.read_text().splitlines()[-1].endswith(" export-42 0"), log.read_text()
