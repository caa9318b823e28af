"""The journal (``{<service>-input}:events``) against real Redis 8.x and 7.0: what the consumers
write (failures, recoveries and who took the streams over, tallies, starts and stops), its cap, a
key of the wrong type, and :func:`lbs.events.read_events`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._consumer import journal
from lbs._keys import events_stream
from lbs.events import Event, read_events
from lbs.testing import abandon, probe

from _helpers import client, eventually, produce, take


@pytest.fixture(autouse=True)
def quick_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flush every 50 ms instead of every second (what is written is the same)."""
    monkeypatch.setattr(journal, "FLUSH_EVERY", 0.05)


async def events_of(
    url: str, service: str, kind: str, n: int = 1, timeout: float = 20.0
) -> list[Event]:
    """Once at least ``n`` events of ``kind`` are in the journal: all of them."""
    found: list[Event] = []

    async def enough() -> bool:
        nonlocal found
        found = await read_events(url, service, kinds=[kind])
        return len(found) >= n

    await eventually(enough, timeout)
    return found


async def test_a_failing_handler_is_journalled_with_its_traceback(
    any_server: Any, service: str
) -> None:
    url = any_server.url
    tries: list[str] = []

    async def handler(note: lbs.Notification) -> None:
        tries.append(note.stream)
        if len(tries) == 1:
            raise ValueError("first try fails")

    await produce(url, service, "s1")
    c = client(url, service, "c1", retry_delay=0.0, journal_interval=0.1)
    worker = asyncio.create_task(c.run(handler, concurrency=4))
    try:
        await c.wait_finished(1)
        (failed,) = await events_of(url, service, "failed")
        assert failed.consumer == c.id and failed.fields["stream"] == "s1"
        assert failed.fields["retry_count"] == "0" and failed.fields["token"].isdigit()
        assert "ValueError: first try fails" in failed.fields["reason"]
        assert (
            "Traceback" in failed.fields["traceback"]
            and "first try fails" in failed.fields["traceback"]
        )
        # The retry took the re-queued copy: "retaken", naming the failed entry as its original.
        (retaken,) = await events_of(url, service, "retaken")
        assert retaken.fields["original_id"] == failed.fields["entry_id"]
        assert retaken.fields["stream"] == "s1" and retaken.fields["retry_count"] == "1"
        tallies = await events_of(url, service, "tally")
        await eventually(
            lambda: _sum(url, service, "done", 1), 20
        )  # the tally of the finish may come later
        assert sum(int(t.fields["failed"]) for t in tallies) <= 1
    finally:
        await c.close()
        await worker
    started = await read_events(url, service, kinds=["started", "stopped"])
    assert [e.kind for e in started] == ["started", "stopped"]
    assert started[0].fields["pid"].isdigit() and started[0].fields["version"]
    assert started[1].fields["handed_back"] == "0"
    assert await _sum(url, service, "failed", 1)


async def _sum(url: str, service: str, name: str, want: int) -> bool:
    tallies = await read_events(url, service, kinds=["tally"])
    return sum(int(t.fields[name]) for t in tallies) == want


async def test_a_dead_consumers_recovery_names_the_holder_and_the_taker(
    any_server: Any, service: str
) -> None:
    """c1 takes three streams and dies; c2 recovers them: "recovered" events name c1 and its
    deadline, and every stream comes back as a copy under a new id whose "retaken" names c2."""
    url = any_server.url
    await produce(url, service, "a", "b", "c")
    dead = client(url, service, "c1", lock_ttl=0.5)
    await dead.start()
    await take(dead, 3)
    await abandon(dead)
    # c2 has room for one: recovery re-queues all three (whatever the room), and c2 reads the copies.
    taker = client(url, service, "c2", max_streams=1, lock_ttl=0.5)
    await taker.start()
    try:
        done = 0
        while done < 3:
            note = await taker.next_notification(timeout=20)
            assert note is not None
            if note.type is lbs.NotificationType.STREAM_ADDED:
                await taker.done_stream(note.stream)
                done += 1
        recovered = await events_of(url, service, "recovered", 3)
        assert {e.fields["stream"] for e in recovered} == {"a", "b", "c"}
        assert {e.fields["holder"] for e in recovered} == {dead.id}
        assert all(e.consumer == taker.id for e in recovered)
        assert all(e.fields["path"] in ("deadline", "keyspace", "scan") for e in recovered)
        assert all(
            e.fields["deadline_ms"].isdigit() for e in recovered if e.fields["path"] != "scan"
        )
        assert all("adopted" not in e.fields for e in recovered)
        copies = {e.fields["new_entry_id"] for e in recovered}
        assert len(copies) == 3 and not copies & {e.fields["entry_id"] for e in recovered}
        retaken = await events_of(url, service, "retaken", 3)
        assert {e.fields["entry_id"] for e in retaken} == copies  # each copy, taken by c2
        assert {e.consumer for e in retaken} == {taker.id}
    finally:
        await taker.close()
    assert not [
        e for e in await read_events(url, service) if e.consumer == dead.id and e.kind == "stopped"
    ]


async def test_tallies_add_up_to_what_two_clients_processed(any_server: Any, service: str) -> None:
    url = any_server.url
    names = [f"s{i}" for i in range(40)]
    await produce(url, service, *names)

    async def handler(note: lbs.Notification) -> None:
        await asyncio.sleep(0)

    clients = [client(url, service, f"c{i}", journal_interval=0.1) for i in (1, 2)]
    workers = [asyncio.create_task(c.run(handler, concurrency=5)) for c in clients]
    try:
        await eventually(lambda: _finished(clients, 40), 30)
    finally:
        for c in clients:
            await c.close()
        for w in workers:
            await w
    tallies = await read_events(url, service, kinds=["tally"])
    assert sum(int(t.fields["done"]) for t in tallies) == 40
    assert {t.consumer for t in tallies} <= {c.id for c in clients}
    assert all(int(t.fields["interval_ms"]) >= 0 for t in tallies)


async def _finished(clients: list[lbs.Client], n: int) -> bool:
    return sum(c.stats.finished for c in clients) >= n


async def test_journal_off_writes_nothing(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    url = any_server.url
    await produce(url, service, "a")
    c = client(url, service, "c1", journal=False, journal_interval=0.1)
    await c.start()
    assert probe(c).state.journal.task is None
    (note,) = await take(c, 1)
    await c.done_stream(note.stream)
    await asyncio.sleep(0.3)
    await c.close()
    assert not await rr.exists(events_stream(service))


async def test_the_journal_stays_capped(any_server: Any, service: str, rr: aioredis.Redis) -> None:
    url = any_server.url
    c = client(url, service, "c1", journal_maxlen=100)
    await c.start()
    try:
        j = probe(c).state.journal
        for _ in range(10):
            for i in range(100):
                j.record("disowned", stream=f"s{i}", entry_id="1-1", token=i, reason="test")
            await j.flush()  # (the task may have flushed some, and "started", first)
    finally:
        await c.close()
    # MAXLEN ~ trims whole macro nodes (100 entries each by default): about the cap, never all 1,000.
    assert await rr.xlen(events_stream(service)) < 300
    assert len(await read_events(url, service, kinds=["disowned"], count=5000)) < 300


async def test_an_events_key_of_the_wrong_type_stops_nothing(
    any_server: Any, service: str, rr: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    url = any_server.url
    key = events_stream(service)
    await rr.hset(key, "not", "a stream")
    await produce(url, service, "a", "b")
    done: list[str] = []

    async def handler(note: lbs.Notification) -> None:
        done.append(note.stream)

    c = client(url, service, "c1", journal_interval=0.1)
    caplog.set_level(logging.WARNING, logger="lbs")
    worker = asyncio.create_task(c.run(handler, concurrency=2))
    try:
        await c.wait_finished(2)
        await eventually(lambda: _logged(caplog, key), 20)
    finally:
        await c.close()
        await worker
    assert sorted(done) == ["a", "b"]
    assert await rr.type(key) == b"hash"
    with pytest.raises(lbs.RedisOperationError, match=f"LBSKEY {key} holds a hash"):
        await read_events(url, service)


async def _logged(caplog: pytest.LogCaptureFixture, key: str) -> bool:
    return any(key in r.getMessage() and "another type" in r.getMessage() for r in caplog.records)


async def test_read_events_filters_by_kind_and_time(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    url = any_server.url
    key = events_stream(service)
    assert await read_events(url, service) == []  # no journal yet
    for i, kind in enumerate(["started", "failed", "tally", "failed", "stopped"]):
        await rr.xadd(key, {"kind": kind, "consumer": "c1", "n": str(i)}, id=f"{1000 * (i + 1)}-0")
    every = await read_events(url, service)
    assert [e.kind for e in every] == ["started", "failed", "tally", "failed", "stopped"]
    assert every[1] == Event("2000-0", 2000, "failed", "c1", {"n": "1"})
    assert every[1].to_dict() == {
        "id": "2000-0",
        "time_ms": 2000,
        "kind": "failed",
        "consumer": "c1",
        "fields": {"n": "1"},
    }
    assert [e.id for e in await read_events(url, service, kinds=["failed"])] == ["2000-0", "4000-0"]
    assert [e.id for e in await read_events(url, service, since_ms=3000)] == [
        "3000-0",
        "4000-0",
        "5000-0",
    ]
    assert [e.id for e in await read_events(url, service, count=2)] == ["4000-0", "5000-0"]
    assert [e.id for e in await read_events(url, service, kinds=["failed"], count=1)] == ["4000-0"]
    assert await read_events(url, service, count=0) == []
    with pytest.raises(lbs.ConfigurationError):
        await read_events(url, service, kinds="failed")
