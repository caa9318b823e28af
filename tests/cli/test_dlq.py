"""``lbs dlq list|show|replay|purge`` with real dead letters, on real servers (8.x and 7.0)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys

from _helpers import client, eventually, is_true, produce

# rr is a fixture.
from _pty import flat, invoke, rr  # noqa: F401

pytestmark = pytest.mark.integration


async def _len_is(r: aioredis.Redis, key: str, n: int) -> bool:
    return bool(await r.xlen(key) == n)


async def make_letters(r: aioredis.Redis, url: str, service: str) -> dict[str, str]:
    """Four real dead letters: s1, s2, s3 (their handler raised, max_retries=0) and a malformed entry.

    Returns the LBS entry id of each, by stream name ("bad" for the malformed one).
    """
    ids = dict(zip(["s1", "s2", "s3"], await produce(url, service, "s1", "s2", "s3")))
    ids["bad"] = (await r.xadd(_keys.input_stream(service), {"lbs-input": "{not json"})).decode()

    async def boom(note: lbs.Notification) -> None:
        raise ValueError(f"boom {note.stream}")

    await run_until(
        url,
        service,
        "failing",
        boom,
        lambda: _len_is(r, _keys.dead_letter_stream(service), 4),
        max_retries=0,
    )
    return ids


async def run_until(
    url: str, service: str, name: str, handler: Any, done: Any, **config: Any
) -> None:
    """Run a consumer's ``run(handler)`` until ``done()`` holds, then close it."""
    c = client(url, service, name, retry_delay=0.0, **config)
    await c.start()
    task = asyncio.create_task(c.run(handler, handle_signals=False))
    try:
        await eventually(done, timeout=30)
    finally:
        await c.close()
        await task


async def lbs_entries(r: aioredis.Redis, service: str) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in await r.xrange(_keys.input_stream(service))
    ]


async def test_list_show_replay_purge_round_trip(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    url, dlq = any_server.url, _keys.dead_letter_stream(service)
    ids = await make_letters(rr, url, service)

    # -- list: newest first, --limit, --reason (case-insensitive) ----------------------
    result = await invoke("dlq", "list", service, "--url", url, "--json")
    assert result.exit_code == 0, result.output
    letters = json.loads(result.stdout)
    assert len(letters) == 4
    assert [x["id"] for x in letters] == sorted(
        (x["id"] for x in letters), key=_id_key, reverse=True
    )
    by_failed = {x["failed_id"]: x for x in letters}
    assert set(by_failed) == set(ids.values())
    for name in ("s1", "s2", "s3"):
        letter = by_failed[ids[name]]
        assert letter["reason"] == f"handler raised ValueError: boom {name}"
        assert (letter["stream"], letter["retry_count"], letter["consumer"]) == (
            name,
            1,
            "redis-consumer-failing",
        )
        # The failure keeps its story: the traceback, ending with the exception, through the handler's frame.
        trace = letter["traceback"]
        assert (
            trace.startswith("Traceback")
            and "in boom" in trace
            and trace.endswith(f"ValueError: boom {name}\n")
        )
    assert by_failed[ids["bad"]]["traceback"] == ""  # malformed: no exception, no traceback
    assert by_failed[ids["bad"]]["stream"] == "" and "JSON" in by_failed[ids["bad"]]["reason"]
    result = await invoke("dlq", "list", service, "--url", url, "--json", "--limit", "2")
    assert [x["id"] for x in json.loads(result.stdout)] == [x["id"] for x in letters[:2]]
    result = await invoke("dlq", "list", service, "--url", url, "--json", "--reason", "BOOM")
    assert sorted(x["stream"] for x in json.loads(result.stdout)) == ["s1", "s2", "s3"]
    result = await invoke("dlq", "list", service, "--url", url)
    assert (
        result.exit_code == 0
        and "(malformed)" in result.stdout
        and "boom s2" in flat(result.stdout)
    )

    # -- show ----------------------------------------------------------------------
    s2 = by_failed[ids["s2"]]["id"]
    result = await invoke("dlq", "show", service, s2, "--url", url, "--json")
    shown = json.loads(result.stdout)
    assert shown["fields"]["_failed_id"] == ids["s2"] and shown["fields"]["_retry_count"] == "1"
    assert json.loads(shown["fields"]["lbs-input"])["DataStreamName"] == "s2"
    result = await invoke("dlq", "show", service, s2, "--url", url)
    assert (
        result.exit_code == 0
        and '"DataStreamName": "s2"' in result.stdout
        and "_consumer" in result.stdout
    )
    result = await invoke("dlq", "show", service, "1-0", "--url", url)
    assert result.exit_code == 1 and f"no dead letter 1-0 in {dlq}" in flat(result.stderr)

    # -- replay by reason: fresh assignments with their history, consumed again --------
    result = await invoke("dlq", "replay", service, "--url", url, "--reason", "boom", "--json")
    assert result.exit_code == 0, result.output
    replays = json.loads(result.stdout)
    assert [r["outcome"] for r in replays] == ["replayed"] * 3
    assert await rr.xlen(dlq) == 1
    entries = await lbs_entries(rr, service)
    assert len(entries) == 3
    for entry in entries:
        name = json.loads(entry["lbs-input"])["DataStreamName"]
        letter = by_failed[ids[name]]
        assert entry == {
            "lbs-input": entry["lbs-input"],
            "_retry_count": "0",
            "_original_id": ids[name],
            "_replayed_from": letter["id"],
            "_last_reason": letter["reason"],
            "_replay_count": "1",
        }
    seen: list[tuple[str, int]] = []

    async def record(note: lbs.Notification) -> None:
        seen.append((note.stream, note.retry_count))

    await run_until(url, service, "ok", record, lambda: is_true(len(seen) == 3))
    assert sorted(seen) == [("s1", 0), ("s2", 0), ("s3", 0)]
    assert await rr.xlen(_keys.input_stream(service)) == 0

    # -- a malformed letter is refused, unless forced; it comes back with its history --
    bad = by_failed[ids["bad"]]["id"]
    result = await invoke("dlq", "replay", service, "--url", url, "--all")
    assert result.exit_code == 3 and "refused" in result.stdout and bad in result.stdout
    assert await rr.xlen(dlq) == 1
    result = await invoke("dlq", "replay", service, bad, "--url", url, "--force")
    assert result.exit_code == 0 and "Replayed 1 dead letter" in result.stdout
    await run_until(url, service, "again", record, lambda: _len_is(rr, dlq, 1))
    (again,) = json.loads((await invoke("dlq", "list", service, "--url", url, "--json")).stdout)
    assert again["fields"]["_replayed_from"] == bad and again["fields"]["_replay_count"] == "1"
    assert (
        again["fields"]["_original_id"] == ids["bad"]
        and again["fields"]["_last_reason"] == again["reason"]
    )
    result = await invoke(
        "dlq", "replay", service, again["id"], "1-0", "--url", url, "--force", "--json"
    )
    assert result.exit_code == 3  # 1-0 is not there
    assert [(r["letter_id"], r["outcome"]) for r in json.loads(result.stdout)] == [
        (again["id"], "replayed"),
        ("1-0", "missing"),
    ]
    (entry,) = await lbs_entries(rr, service)
    assert (entry["_replay_count"], entry["_replayed_from"], entry["_retry_count"]) == (
        "2",
        again["id"],
        "0",
    )

    # -- purge: asks first; no is no -----------------------------------------------
    for reason in ("poison A", "poison B", "other"):
        await rr.xadd(dlq, {"lbs-input": '{"DataStreamName":"p","Info":{}}', "_reason": reason})
    result = await invoke("dlq", "purge", service, "--url", url, "--reason", "poison", input="n\n")
    assert (
        result.exit_code == 3
        and "Delete 2 dead letters" in result.stdout
        and "Nothing deleted" in result.stderr
    )
    assert await rr.xlen(dlq) == 3
    result = await invoke(
        "dlq", "purge", service, "--url", url, "--reason", "poison"
    )  # no answer at all
    assert result.exit_code == 3 and await rr.xlen(dlq) == 3
    result = await invoke("dlq", "purge", service, "--url", url, "--reason", "poison", input="y\n")
    assert result.exit_code == 0 and "Deleted 2 dead letters" in result.stdout
    (other,) = await rr.xrange(dlq)
    assert other[1][b"_reason"] == b"other"
    result = await invoke("dlq", "purge", service, other[0].decode(), "1-0", "--url", url, "--yes")
    assert (
        result.exit_code == 3
        and "Deleted 1 dead letter" in result.stdout
        and "1 of the given ids" in result.stdout
    )
    result = await invoke("dlq", "purge", service, "--url", url, "--all", "--yes")
    assert result.exit_code == 0 and "nothing deleted" in result.stdout and await rr.xlen(dlq) == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["replay"], "say which letters"),
        (["purge"], "say which letters"),
        (["replay", "1-0", "--all"], "not both"),
        (["purge", "12"], "not a stream id"),
        (["show", "x"], "not a stream id"),
        (["replay", "--reason", ""], "non-empty"),
    ],
)
async def test_a_command_line_that_does_not_say_which_letters_is_refused(
    redis_server: Any, service: str, args: list[str], message: str
) -> None:
    result = await invoke("dlq", args[0], service, *args[1:], "--url", redis_server.url)
    assert result.exit_code == 2 and message in flat(result.stderr)


async def test_a_dead_letter_key_of_the_wrong_type_is_named(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    await rr.rpush(_keys.dead_letter_stream(service), "x")
    for args in (["list"], ["replay", "--all"], ["purge", "--all", "--yes"]):
        result = await invoke("dlq", *args[:1], service, *args[1:], "--url", any_server.url)
        assert result.exit_code == 1, args
        assert (
            f"LBSKEY {_keys.dead_letter_stream(service)} holds a list, not the dead-letter stream"
            in flat(result.stderr)
        )
        assert "Traceback" not in result.output


async def test_an_empty_dead_letter_stream_lists_nothing(redis_server: Any, service: str) -> None:
    await produce(redis_server.url, service, "a")  # the service exists; no dead letter yet
    result = await invoke("dlq", "list", service, "--url", redis_server.url)
    assert result.exit_code == 0 and "No dead letters (0 in the stream)" in result.stdout
    result = await invoke("dlq", "replay", service, "--url", redis_server.url, "--all")
    assert result.exit_code == 0 and "nothing replayed" in result.stdout


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


async def test_a_keyed_letter_is_listed_by_its_key_with_its_consumer_and_exception(
    any_server: Any, rr: aioredis.Redis, service: str
) -> None:
    url = any_server.url
    async with lbs.Publisher(url, service) as pub:
        await pub.publish_many([("order-7", {"n": "poison"})])

    async def boom(batch: Any) -> None:
        raise ValueError(f"cannot take {batch.messages[0].fields['n']}")

    c = client(url, service, "keyed", max_retries=0, retry_delay=0.0)
    task = asyncio.create_task(c.run_keyed(boom, handle_signals=False))
    try:
        await eventually(lambda: _len_is(rr, _keys.dead_letter_stream(service), 1), timeout=30)
    finally:
        await c.close()
        await task
    result = await invoke("dlq", "list", service, "--url", url, "--json")
    assert result.exit_code == 0, result.output
    (letter,) = json.loads(result.stdout)
    assert letter["key"] == "order-7" and letter["consumer"] == c.id
    assert "ValueError: cannot take poison" in letter["reason"]
    assert (
        letter["traceback"].endswith("ValueError: cannot take poison\n")
        and "in boom" in letter["traceback"]
    )
    result = await invoke("dlq", "list", service, "--url", url)
    assert "key order-7" in flat(result.output) and "(malformed)" not in result.output
