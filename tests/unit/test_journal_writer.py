"""The journal's writer without a server: the buffer's bound, the bound on failure events, tallies
only when something happened, nothing at all when off, a failed write dropped and logged once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from lbs._consumer import journal
from lbs._consumer.journal import Journal
from lbs._redis.errors import WrongTypeError
from lbs.config import Config

from _fakewire import FAST, FakeRedis, Harness


class Batch:
    """Stands in for a CommandBatch: keeps the commands."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []

    def command(self, *args: Any) -> None:
        self.commands.append(args)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """Every event a flush writes (its XADD's fields), each answered with an id."""
    out: list[dict[str, str]] = []

    async def execute(self: Any, build: Callable[[Any], None], *a: Any, **k: Any) -> list[Any]:
        b = Batch()
        build(b)
        for args in b.commands:
            assert args[:6] == ("XADD", args[1], "MAXLEN", "~", args[4], "*")
            flat = args[6:]
            out.append(dict(zip(flat[::2], flat[1::2])))
        return [f"{i}-0" for i in range(len(b.commands))]

    monkeypatch.setattr(journal.Wire, "execute", execute)
    return out


def _journal(fake: FakeRedis, **config: Any) -> tuple[Harness, Journal]:
    h = Harness(fake, Config(**FAST, **config))
    return h, h.state.journal


async def test_the_buffer_is_bounded_and_what_it_drops_is_counted(
    fake: FakeRedis, sent: list[dict[str, str]]
) -> None:
    h, j = _journal(fake)
    for i in range(journal.BUFFER + 7):
        j.record("disowned", stream=f"s{i}", entry_id="1-0", token=i, reason="r")
    assert await j.flush() == journal.BUFFER
    assert sent[0] == {
        "kind": "disowned",
        "consumer": h.names.id,
        "stream": "s0",
        "entry_id": "1-0",
        "token": "0",
        "reason": "r",
    }
    sent.clear()
    j.tally()  # nothing else happened, but 7 events were lost: said so
    await j.flush()
    ((tally),) = sent
    assert tally["kind"] == "tally" and tally["dropped"] == "7" and tally["done"] == "0"


async def test_failure_events_are_bounded_per_flush_the_rest_only_counted(
    fake: FakeRedis, sent: list[dict[str, str]]
) -> None:
    h, j = _journal(fake)
    held = h.take("s")
    for _ in range(journal.FAILED_PER_FLUSH + 50):
        h.state.stats.handler_failures += 1
        j.failed(held, "handler raised ValueError: x", "Traceback ...\n" + "x" * 10_000)
    j.record("disowned", stream="s", entry_id=held.entry_id, token=held.token, reason="r")
    j.tally()
    await j.flush()
    failed = [e for e in sent if e["kind"] == "failed"]
    assert len(failed) == journal.FAILED_PER_FLUSH
    assert len(failed[0]["traceback"]) == journal.TRACEBACK_CHARS
    assert failed[0]["stream"] == "s" and failed[0]["retry_count"] == "0"
    assert [e["kind"] for e in sent if e["kind"] != "failed"] == ["disowned", "tally"]
    tally = sent[-1]
    assert tally["failed"] == str(journal.FAILED_PER_FLUSH + 50) and tally["unlisted"] == "50"
    # The next flush lists failures again.
    sent.clear()
    j.failed(held, "again", "")
    await j.flush()
    assert [e["kind"] for e in sent] == ["failed"]


async def test_a_tally_only_when_a_count_moved(fake: FakeRedis, sent: list[dict[str, str]]) -> None:
    h, j = _journal(fake)
    j.tally()
    assert await j.flush() == 0 and sent == []  # idle: nothing written, no round trip
    h.state.stats.finished += 3
    h.state.stats.dead_lettered += 1
    h.hooks.metric("recovery_scan_requeued_total", 2)
    h.hooks.metric("recovery_deadline_requeued_total", 1)
    j.tally()
    j.tally()  # nothing more since
    await j.flush()
    ((tally),) = sent
    assert (tally["done"], tally["dead_lettered"], tally["recovered"], tally["failed"]) == (
        "3",
        "1",
        "3",
        "0",
    )


async def test_off_records_nothing_and_runs_no_task(
    fake: FakeRedis, sent: list[dict[str, str]]
) -> None:
    h, j = _journal(fake, journal=False)
    j.start()
    assert j.task is None
    j.record("disowned", stream="s", entry_id="1-0", token=1, reason="r")
    j.failed(h.take("s"), "r", "")
    h.state.stats.finished += 1
    j.tally()
    await j.close(0)
    assert await j.flush() == 0 and sent == []


async def test_a_failed_write_is_dropped_counted_and_logged_once(
    fake: FakeRedis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    replies: list[Any] = [RedisConnectionError("gone")]

    async def execute(self: Any, build: Callable[[Any], None], *a: Any, **k: Any) -> list[Any]:
        b = Batch()
        build(b)
        reply = replies[0]
        if isinstance(reply, Exception) and not isinstance(reply, WrongTypeError):
            raise reply
        return [reply] * len(b.commands)

    monkeypatch.setattr(journal.Wire, "execute", execute)
    caplog.set_level(logging.WARNING, logger="lbs")
    _, j = _journal(fake)
    for _ in range(2):
        j.record("disowned", stream="s", entry_id="1-0", token=1, reason="r")
        assert await j.flush() == 0
    assert [r.getMessage() for r in caplog.records if "journal" in r.getMessage()] == [
        f"[redis-consumer-unit] writing the journal {j.key} failed (ConnectionError: gone); "
        "those events are dropped, counted in the next tally (logged again in 60s at most)"
    ]
    # A key of the wrong type: the message names it.
    caplog.clear()
    monkeypatch.setattr(journal, "LOG_EVERY", 0.0)
    replies[0] = WrongTypeError("WRONGTYPE Operation against a key holding the wrong kind of value")
    j.record("disowned", stream="s", entry_id="1-0", token=1, reason="r")
    assert await j.flush() == 0
    (record,) = [r for r in caplog.records if "journal" in r.getMessage()]
    assert j.key in record.getMessage() and "another type" in record.getMessage()
