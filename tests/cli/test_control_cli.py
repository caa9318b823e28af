"""``lbs pause``, ``lbs resume``, ``lbs release``, ``lbs cancel``, ``lbs claim --force`` on a real Redis,
against consumers running ``run()`` in the test's loop (the command runs in a thread)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis
from click.testing import Result
from typer.testing import CliRunner

import lbs
from lbs.cli import app
from lbs.events import read_events

from _helpers import Hold, eventually, is_true, running

pytestmark = pytest.mark.timeout(120)


async def lbs_cli(*args: str) -> Result:
    runner = CliRunner(env={"COLUMNS": "200", "LINES": "100"})
    return await asyncio.to_thread(runner.invoke, app, list(args), catch_exceptions=False)


async def test_pause_and_resume_from_the_cli(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    url = redis_server.url
    h = Hold()
    h.go.set()
    async with running(url, service, h):
        await lbs.Producer(r, service).add_stream("first")
        await eventually(lambda: is_true(len(h.calls) == 1), timeout=10)
        result = await lbs_cli("pause", service, "--url", url, "--reason", "upgrade", "--by", "ops")
        assert result.exit_code == 0, result.output
        assert "paused by ops: upgrade" in result.stdout
        status = await lbs_cli("status", service, "--url", url, "--json")
        assert json.loads(status.stdout)["paused"]["by"] == "ops"
        await lbs.Producer(r, service).add_stream("second")
        await asyncio.sleep(2)
        assert len(h.calls) == 1  # paused: not taken
        result = await lbs_cli("resume", service, "--url", url, "--by", "ops", "--json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["was"]["reason"] == "upgrade"
        await eventually(lambda: is_true(len(h.calls) == 2), timeout=15)
        result = await lbs_cli("resume", service, "--url", url)
        assert result.exit_code == 0 and "was not paused" in result.stdout
    kinds = [e.kind for e in await read_events(r, service)]
    assert kinds.count("paused") == 1 and kinds.count("resumed") == 2


async def test_release_cancel_and_force_claim_from_the_cli(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    url = redis_server.url
    h = Hold()
    a, b, c = await lbs.Producer(r, service).add_streams(["a", "b", "c"])
    async with running(url, service, h):
        await eventually(lambda: is_true(len(h.calls) == 3), timeout=10)
        result = await lbs_cli("release", service, a, "1-1", "--url", url, "--json")
        assert result.exit_code == 0, result.output
        got = {d["entry_id"]: d for d in json.loads(result.stdout)}
        assert got[a]["outcome"] == "released" and got["1-1"]["outcome"] == "not held"
        result = await lbs_cli("cancel", service, b, "--url", url, "--reason", "bad input")
        assert result.exit_code == 0, result.output
        assert "cancelled" in result.stdout
        result = await lbs_cli("claim", service, c, "--url", url, "--force", "--json")
        assert result.exit_code == 0, result.output
        (forced,) = json.loads(result.stdout)
        assert forced["outcome"] == "force-claimed" and "(retry 1)" in forced["detail"]
        await eventually(lambda: is_true(sorted(h.cancelled) == sorted([a, b, c])), timeout=10)
        # a is back (no retry), c is back (one retry); b is a dead letter.
        await eventually(lambda: is_true(len(h.calls) == 5), timeout=15)
        again = {n.stream: n.retry_count for n in h.calls[3:]}
        assert again == {"a": 0, "c": 1}
        h.go.set()
    async with lbs.DeadLetters(r, service) as dlq:
        (letter,) = await dlq.list(5)
    assert letter.reason.endswith("bad input") and letter.failed_id == b


async def test_a_holder_that_does_not_answer_exits_3(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    """A holder without controls (a plain XREADGROUP reader): the order goes unanswered."""
    url = redis_server.url
    (entry_id,) = await lbs.Producer(r, service).add_streams(["x"])
    await r.xgroup_create(lbs.input_stream(service), lbs.group_name(service), "0")
    await r.xreadgroup(lbs.group_name(service), "old-consumer", {lbs.input_stream(service): ">"})
    result = await lbs_cli("release", service, entry_id, "--url", url, "--wait", "0.3")
    assert result.exit_code == 3, result.output
    assert "no answer" in result.stdout
    assert not await r.keys(
        lbs._keys.hash_tag(service) + ":orders:*"
    )  # the unanswered order is taken back


async def test_a_mistyped_service_is_refused(redis_server: Any, service: str) -> None:
    result = await lbs_cli("pause", "nosuch-" + service, "--url", redis_server.url)
    assert result.exit_code == 1


async def test_pause_and_resume_a_sharded_service(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    # `--shards 3`: every shard paused, a legacy shard a producer wrote to as well; a ShardedClient
    # then takes nothing of what waits in any of them until the resume.
    from lbs._placement import legacy_names

    url = redis_server.url
    names = [f"n{i}" for i in range(12)]
    async with lbs.Producer(r, service, shards=3) as producer:
        await producer.add_streams(names)
    legacy = legacy_names(service, 3)[0]
    await r.xadd(lbs.input_stream(legacy), {"lbs-input": lbs.encode_input("old")})
    result = await lbs_cli("pause", service, "--url", url, "--shards", "3", "--by", "ops", "--json")
    assert result.exit_code == 0, result.output
    paused = json.loads(result.stdout)["shards"]
    assert set(paused) == {*lbs.shard_services(service, 3), legacy}
    for name in paused:
        assert (await lbs.ServiceControls(r, name).paused()) is not None
    status = await lbs_cli("status", service, "--url", url, "--shards", "3")
    assert status.stdout.count("PAUSED") == 4, status.stdout  # three shards and the legacy one
    seen: list[str] = []

    async def handle(note: lbs.Notification) -> None:
        seen.append(note.stream)

    c = lbs.ShardedClient(url, service, "c", shards=3, load_entrypoint_plugins=False)
    runner = asyncio.create_task(c.run(handle))
    try:
        await asyncio.sleep(2)
        assert seen == []  # paused: nothing taken from any shard
        result = await lbs_cli("resume", service, "--url", url, "--shards", "3")
        assert result.exit_code == 0, result.output
        assert "resumed" in result.stdout
        await eventually(lambda: is_true(len(seen) == 13), timeout=30)
    finally:
        await c.close()
        await runner
    assert sorted(seen) == sorted([*names, "old"])
    missing = await lbs_cli("pause", "nosuch", "--url", url, "--shards", "3")
    assert missing.exit_code == 1
