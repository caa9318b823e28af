"""lbs-dlq-jsonl against a real Redis: a malformed assignment ends up as a line in the file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs_dlq_jsonl import JsonLinesBackend, JsonLinesPlugin, plugin


async def _until_empty(r: aioredis.Redis, key: str, timeout: float = 10.0) -> None:
    async def wait() -> None:
        while not (await r.exists(key) and await r.xlen(key) == 0):
            await asyncio.sleep(0.02)  # polled: no event announces the delete

    await asyncio.wait_for(wait(), timeout)


async def test_a_dead_letter_lands_in_the_file_and_leaves_the_stream(
    redis_server: Any, service: str, r: aioredis.Redis, tmp_path: Path
) -> None:
    stream = lbs.input_stream(service)
    await r.xgroup_create(stream, lbs.group_name(service), id="0", mkstream=True)
    bad_id = (await r.xadd(stream, {"lbs-input": "[1, 2"})).decode()
    path = tmp_path / "{service}.jsonl"
    c = lbs.Client(
        redis_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1),
        plugins=[JsonLinesPlugin(path)],
        load_entrypoint_plugins=False,
    )
    await c.start()
    try:
        await _until_empty(r, lbs.dead_letter_stream(service))
    finally:
        await c.close()
    (line,) = (tmp_path / f"{service}.jsonl").read_text().splitlines()
    letter = json.loads(line)
    assert letter["failed_id"] == bad_id and letter["fields"]["lbs-input"] == "[1, 2"
    assert letter["reason"] and letter["consumer"] == c.id


def test_the_installed_plugin_is_inert_until_given_a_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    client = lbs.Client("redis://127.0.0.1:1", "svc", "c", load_entrypoint_plugins=False)
    monkeypatch.delenv("LBS_DLQ_JSONL_PATH", raising=False)
    assert plugin.lbs_dead_letter_backend(client) is None
    monkeypatch.setenv("LBS_DLQ_JSONL_PATH", str(tmp_path / "{service}.jsonl"))
    backend = plugin.lbs_dead_letter_backend(client)
    assert isinstance(backend, JsonLinesBackend) and backend.path == tmp_path / "svc.jsonl"


async def test_a_batch_is_one_line_per_letter(tmp_path: Path) -> None:
    backend = JsonLinesBackend(tmp_path / "sub" / "x.jsonl")
    await backend.write(
        [lbs.DeadLetter("1-0", {"_reason": "a"}), lbs.DeadLetter("2-0", {"_reason": "b"})]
    )
    await backend.write([lbs.DeadLetter("3-0", {"_reason": "c"})])
    rows = [json.loads(x) for x in (tmp_path / "sub" / "x.jsonl").read_text().splitlines()]
    assert [(x["id"], x["reason"]) for x in rows] == [("1-0", "a"), ("2-0", "b"), ("3-0", "c")]
