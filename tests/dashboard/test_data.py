"""The journal's reductions, without a server: per-minute tallies, and the recovery timeline's
joins (a re-queued copy to the consumer that took it)."""

from __future__ import annotations

from lbs import shard_services
from lbs.dashboard import DashboardSettings
from lbs.dashboard.data import Incident, Moment, recovery_timeline, tally_series
from lbs.events import Event

T0 = 28_333_333 * 60_000  # a minute boundary


def ev(ms: int, kind: str, consumer: str, **fields: str) -> Event:
    return Event(f"{ms}-0", ms, kind, consumer, fields)


def test_tallies_are_summed_per_minute_over_the_last_hour() -> None:
    now = T0 + 59 * 60_000 + 30_000
    events = [
        ev(T0 - 1, "tally", "a", done="100"),  # before the hour: left out
        ev(T0 + 1_000, "tally", "a", done="3", failed="1"),
        ev(T0 + 2_000, "tally", "b", done="4"),
        ev(now - 1_000, "tally", "a", done="7", failed="2"),
        ev(now - 500, "recovered", "a", stream="x"),
    ]
    series = tally_series(events, now)
    assert series.minutes == 60 and series.start_ms == T0 and series.any
    assert series.done[0] == 7 and series.failed[0] == 1
    assert series.done[-1] == 7 and series.failed[-1] == 2
    assert sum(series.done) == 14
    assert not tally_series([], now).any


def test_the_timeline_joins_each_recovered_stream_to_who_took_it() -> None:
    deadline = T0 + 1_000
    events = [
        ev(T0, "started", "w2"),
        ev(
            T0 + 2_000,
            "recovered",
            "w2",
            holder="w1",
            stream="a",
            entry_id="1-0",
            new_entry_id="9-0",
            path="deadline",
            deadline_ms=str(deadline),
        ),
        ev(
            T0 + 2_000,
            "recovered",
            "w2",
            holder="w1",
            stream="b",
            entry_id="2-0",
            new_entry_id="12-0",
            path="deadline",
            deadline_ms=str(deadline),
        ),
        ev(T0 + 2_000, "retaken", "w2", stream="b", entry_id="12-0", original_id="2-0"),
        ev(
            T0 + 2_500,
            "recovered",
            "w2",
            holder="w1",
            stream="c",
            entry_id="3-0",
            new_entry_id="10-0",
            path="scan",
            deadline_ms="",
        ),
        ev(T0 + 3_000, "retaken", "w3", stream="a", entry_id="9-0", original_id="1-0"),
        ev(
            T0 + 90_000,
            "recovered",
            "w3",
            holder="w1",
            stream="d",
            entry_id="4-0",
            new_entry_id="11-0",
            path="startup",
            deadline_ms="",
        ),
    ]
    later, first, start = recovery_timeline(events)
    assert isinstance(start, Moment) and start.kind == "started"
    assert isinstance(first, Incident) and isinstance(later, Incident)
    assert first.holder == "w1" and first.recoverers == ["w2"]
    rows = {r.stream: r for r in first.streams}
    assert (rows["a"].taken_by, rows["a"].took_ms) == ("w3", 2_000)  # from the holder's deadline
    assert (rows["b"].taken_by, rows["b"].took_ms) == ("w2", 1_000)  # its recoverer took the copy
    assert rows["c"].taken_by == "" and rows["c"].took_ms is None and rows["c"].deadline_ms is None
    assert first.retaken == 2 and first.slowest_ms == 2_000
    assert [r.stream for r in later.streams] == ["d"]  # 90 s later: another incident


def test_a_sharded_service_is_shown_as_its_shards() -> None:
    settings = DashboardSettings.make("redis://127.0.0.1:1", ["orders", "mail"], shards=2)
    # Each shard named by its place in the slots (lbs._placement): orders.0~j or orders.0, ...
    expected = (*shard_services("orders", 2), *shard_services("mail", 2))
    assert settings.shown_services == expected and len(set(expected)) == 4
    assert all(s.startswith(("orders.", "mail.")) for s in expected)
    assert not settings.guarded and settings.masked_url == "redis://127.0.0.1:1"


async def test_process_metrics_are_read_only_from_an_announced_metrics_url() -> None:
    from lbs.dashboard.procmetrics import announced, read_all

    def said(i: int, kind: str, consumer: str, url: str) -> Event:
        return Event(f"{i}-0", i, kind, consumer, {"metrics": url} if url else {})

    events = [
        said(1, "started", "a", "http://10.0.0.1:9100/metrics"),
        said(2, "tally", "a", "http://10.0.0.2:9100/metrics"),  # restarted elsewhere: newest wins
        said(3, "stopped", "b", "http://10.0.0.3:9100/metrics"),  # not an announcement
        said(4, "started", "c", ""),
        said(5, "started", "d", "file:///etc/passwd"),
        said(6, "started", "e", "http://10.0.0.5:9100/admin"),
    ]
    urls = announced(events)
    assert urls == {
        "a": "http://10.0.0.2:9100/metrics",
        "d": "file:///etc/passwd",
        "e": "http://10.0.0.5:9100/admin",
    }
    del urls["a"]
    found = await read_all(urls)  # neither is fetched: nothing listens there, nothing is tried
    assert {c: m.error for c, m in found.items()} == {
        "d": "not an http(s)://HOST/metrics URL: not read",
        "e": "not an http(s)://HOST/metrics URL: not read",
    }
