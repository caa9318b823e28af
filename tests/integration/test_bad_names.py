"""Registrations lbs cannot use among good ones, on a real Redis: each fails alone, never its neighbours.

A foreign producer (redis-cli, a hand-written JSON) can write a lone surrogate escape, the JSON
text ``\\ud800`` without its low half: valid JSON that decodes to a str UTF-8 cannot encode. Such a
registration is dead-lettered when read, with a reason naming the problem, and never reaches a
handler; before, it was delivered and its ``done`` failed the whole batched ``done-n.lua`` call,
leaving every stream finished with it pending. Text a handler produces (an error message with a lone
surrogate) goes into hand-backs, dead letters, keyed commits and the journal escaped, failing no batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys
from lbs._consumer import journal
from lbs.events import read_events

from _helpers import client, eventually, is_true, produce

pytestmark = pytest.mark.timeout(120)

#: ``lbs-input`` values a foreign producer writes with a lone surrogate escape (the JSON text
#: ``\\ud800``, as redis-cli would send it), and what their dead letter's reason names.
BAD = {
    r'{"DataStreamName": "bad\ud800name"}': "DataStreamName 'bad\\ud800name'",
    r'{"DataStreamName":"low\udc00"}': "DataStreamName 'low\\udc00'",
    r'{"DataStreamName":"high then a letter\ud800\u0041"}': "contains '\\ud800'",
    r'{"DataStreamName":"pair then high\ud83d\ude00\ud83d"}': "contains '\\ud83d'",
    r'{"DataStreamName":"info","Info":{"k":"\udfff"}}': "JSON escape \\udfff",
    r'{"Info":{"\ud800":1},"DataStreamName":"info first"}': "JSON escape \\ud800",
}

#: Names that look odd but that UTF-8 encodes: each is a data stream like any other.
ODD = [
    "emoji \U0001f600",  # written as the escaped pair \ud83d\ude00
    "nul \x00 inside",
    "new\nline",
    "line separator \u2028",
    "U+FFFF \uffff and U+FFFD \ufffd",
    "the text \\ud800, escaped backslash",
    f"looks like a Go lock key{_keys.GO_MUTEX_KEY_SEP}1-0",
    "{a hash tag}",
    "long " + "x" * 5000,
]


async def register(r: aioredis.Redis, service: str, good: list[str]) -> dict[str, str]:
    """XADD, as a foreign producer would, ``good`` (plain JSON), :data:`ODD` (every non-ASCII
    character escaped) and :data:`BAD`, interleaved in one pipeline; the bad entries' ids by value."""
    stream = lbs.input_stream(service)
    await r.xgroup_create(stream, lbs.group_name(service), id="0", mkstream=True)
    values = [json.dumps({"DataStreamName": name}) for name in good]
    odd = [json.dumps({"DataStreamName": name, "Info": {"n": 1}}) for name in ODD]
    bad = list(BAD)
    step = max(1, len(values) // (len(odd) + len(bad) + 1))
    for k, v in enumerate(odd + bad):  # spread among the good ones: each batch has neighbours
        values.insert((k + 1) * step + k, v)
    pipe = r.pipeline(transaction=False)
    for v in values:
        pipe.xadd(stream, {"lbs-input": v})
    ids = [i.decode() for i in await pipe.execute()]
    return {v: i for v, i in zip(values, ids) if v in BAD}


async def letters(r: aioredis.Redis, service: str) -> dict[str, str]:
    """The dead letters' reasons, by the id of the entry they were."""
    found = await r.xrange(lbs.dead_letter_stream(service))
    return {f[b"_failed_id"].decode(): f[b"_reason"].decode() for _, f in found}


def assert_bad_dead_lettered(reasons: dict[str, str], bad_ids: dict[str, str]) -> None:
    assert set(reasons) >= set(bad_ids.values())
    for value, entry_id in bad_ids.items():
        reason = reasons[entry_id]
        assert "lone surrogate" in reason and "UTF-8 cannot encode" in reason, reason
        assert BAD[value] in reason, reason


async def assert_nothing_left(r: aioredis.Redis, service: str) -> None:
    stream = lbs.input_stream(service)
    assert (await r.xpending(stream, lbs.group_name(service)))["pending"] == 0
    assert await r.xlen(stream) == 0
    tag = _keys.hash_tag(service)
    assert [k async for k in r.scan_iter(match=f"{tag}:name:*")] == []  # every name released
    assert [k async for k in r.scan_iter(match=f"lock:{tag}:*")] == []


@pytest.mark.parametrize("go", [False, True], ids=["lbs", "go_compatible"])
async def test_run_dead_letters_an_unusable_name_and_finishes_every_other_stream_once(
    any_server: Any, service: str, rr: aioredis.Redis, go: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """On Redis 8.x, Debian's 7.0 and Valkey."""
    url, r = any_server.url, rr
    good = [f"s{i}" for i in range(400)]
    bad_ids = await register(r, service, good)
    seen: Counter[str] = Counter()

    async def handler(note: lbs.Notification) -> None:
        seen[note.stream] += 1

    c = client(url, service, go_compatible=go)
    worker = asyncio.create_task(c.run(handler, concurrency=64))
    try:
        await c.wait_finished(len(good) + len(ODD), timeout=60)
        await eventually(lambda: is_true(c.stats.dead_lettered == len(BAD)), 20)
        # The reader lives on: a registration after them all is taken and finished too.
        await produce(url, service, "after")
        await c.wait_finished(len(good) + len(ODD) + 1, timeout=20)
        assert seen == Counter([*good, *ODD, "after"])  # each once, none of the bad ones
        assert c.stats.done == len(good) + len(ODD) + 1
        assert "done_failures_total" not in c.metrics
        assert_bad_dead_lettered(await letters(r, service), bad_ids)
        await assert_nothing_left(r, service)
    finally:
        await c.close()
        await worker
    errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not [line for line in errors if "finishing" in line]


async def test_done_streams_and_hand_back_under_the_notification_api(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """Notifications taken in batches: most finished with ``done_streams``, the odd names handed back
    once first (then finished with ``done_stream``), one stream handed back out of retries with a reason holding a lone surrogate (its dead
    letter keeps the reason, escaped)."""
    url = redis_server.url
    good = [f"s{i}" for i in range(200)]
    bad_ids = await register(r, service, [*good, "retire me"])
    c = client(url, service, max_retries=0)
    done: Counter[str] = Counter()
    handed_back: set[str] = set()
    retired = ""
    await c.start()
    try:
        while sum(done.values()) < len(good) + len(ODD):
            first = await c.next_notification(timeout=20)
            assert first is not None, f"{sum(done.values())} finished; waiting for more"
            notes = [first, *c.drain_notifications()]
            assert all(note.type is lbs.NotificationType.STREAM_ADDED for note in notes)
            assert not {note.stream for note in notes} & {"bad\ud800name", "info"}
            finish = []
            for note in notes:
                if note.stream == "retire me":
                    retired = await c.hand_back(
                        note.stream, count_retry=True, reason="gave up on \ud800 here", delay=0
                    )
                elif note.stream in ODD and note.stream not in handed_back:
                    handed_back.add(note.stream)
                    assert await c.hand_back(note.stream, note.entry_id, reason="again \udfff")
                elif note.stream in ODD:  # back again: finished alone
                    status = await c.done_stream(note.stream, note.entry_id)
                    assert status is lbs.DoneStatus.DONE
                    done[note.stream] += 1
                else:
                    finish.append(note)
            statuses = await c.done_streams(finish)
            assert statuses == [lbs.DoneStatus.DONE] * len(finish)
            done.update(note.stream for note in finish)
        assert done == Counter([*good, *ODD])
        assert handed_back == set(ODD) and retired == ""
        await eventually(lambda: is_true(c.stats.dead_lettered == len(BAD) + 1), 20)
        reasons = await letters(r, service)
        assert_bad_dead_lettered(reasons, bad_ids)
        assert "gave up on \\ud800 here" in reasons.values()
        await assert_nothing_left(r, service)
    finally:
        await c.close()


async def test_a_handler_error_with_a_lone_surrogate_fails_only_its_stream(
    redis_server: Any, service: str, r: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler raising an error whose text UTF-8 cannot encode: its stream is handed back (dead-lettered
    here, out of retries) with the text escaped, its neighbours finish, and the journal keeps every
    event."""
    monkeypatch.setattr(journal, "FLUSH_EVERY", 0.05)
    url = redis_server.url
    names = [f"s{i}" for i in range(100)]
    failing = set(names[::10])
    await produce(url, service, *names)
    seen: Counter[str] = Counter()

    async def handler(note: lbs.Notification) -> None:
        seen[note.stream] += 1
        if note.stream in failing:
            raise ValueError(f"cannot use {note.stream}: \udcff")

    c = client(url, service, max_retries=0, retry_delay=0.0)
    worker = asyncio.create_task(c.run(handler, concurrency=32))
    try:
        await c.wait_finished(len(names) - len(failing), timeout=30)
        await eventually(lambda: is_true(c.stats.dead_lettered == len(failing)), 20)
        assert seen == Counter(names)
        reasons = list((await letters(r, service)).values())
        assert sorted(reasons) == sorted(
            f"handler raised ValueError: cannot use {s}: \\udcff" for s in failing
        )
        assert (await r.xpending(lbs.input_stream(service), lbs.group_name(service)))[
            "pending"
        ] == 0

        async def journalled() -> bool:
            events = await read_events(url, service, kinds=["failed"])
            return len(events) == len(failing)

        await eventually(journalled, 20)
        events = await read_events(url, service, kinds=["failed"])
        assert {e.fields["stream"] for e in events} == failing
        assert all(e.fields["reason"].endswith(": \\udcff") for e in events)
    finally:
        await c.close()
        await worker


async def test_a_keyed_handler_error_with_a_lone_surrogate_fails_only_its_key(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """The failed key's commit carries the error text escaped: it is dead-lettered, and the keys whose
    commits share its batch go on (before, the batch failed and was sent again for ever)."""
    url = redis_server.url
    keys = [f"k{i}" for i in range(20)]
    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([(key, {"n": i}) for i in range(3) for key in keys])
    seen: Counter[str] = Counter()

    async def handle(batch: lbs.KeyedBatch) -> None:
        if batch.key == "k7":
            raise ValueError("no \ud800 here")
        seen[batch.key] += len(batch.messages)

    c = client(url, service, max_retries=0, retry_delay=0.0, lock_ttl=2.0)
    runner = asyncio.create_task(c.run_keyed(handle))
    try:
        await eventually(lambda: is_true(all(seen[k] == 3 for k in keys if k != "k7")), 30)

        async def k7_dead() -> bool:
            return any(
                "no \\ud800 here" in reason for reason in (await letters(r, service)).values()
            )

        await eventually(k7_dead, 30)
    finally:
        await c.close()
        await runner


class NoteField:
    """A producer plugin whose field's value UTF-8 cannot encode."""

    @lbs.hookimpl
    def lbs_message_fields(self) -> dict[str, str]:
        return {"note": "a lone \ud800", "ok": "kept"}


async def test_a_plugin_field_with_a_lone_surrogate_is_left_out(
    redis_server: Any, service: str, r: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="lbs")
    async with lbs.Producer(
        redis_server.url, service, plugins=[NoteField()], load_entrypoint_plugins=False
    ) as producer:
        (entry_id,) = await producer.add_streams(["s"])
    ((_, fields),) = await r.xrange(lbs.input_stream(service))
    assert fields == {b"lbs-input": lbs.encode_input("s"), b"ok": b"kept"}
    assert entry_id
    assert any("lone surrogate" in rec.getMessage() for rec in caplog.records)


async def test_the_producer_refuses_a_name_utf8_cannot_encode(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    async with lbs.Producer(redis_server.url, service) as producer:
        with pytest.raises(lbs.InvalidInputError, match="lone surrogate"):
            await producer.add_streams(["a", "bad\ud800name", "b"])
        with pytest.raises(lbs.InvalidInputError, match="lone surrogate"):
            await producer.add_stream("ok", {"k": "\udfff"})
    assert not await r.exists(lbs.input_stream(service))
    for value in BAD:
        with pytest.raises(lbs.InvalidInputError, match="lone surrogate"):
            lbs.decode_input(value)
