"""``lbs register SERVICE NAME [--info JSON] [--in DURATION | --at TIME]`` (issue 47, finding 3), and
``lbs status`` showing what it parked."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis.asyncio as aioredis
from typer.testing import CliRunner, Result

import lbs
from lbs import _keys
from lbs.cli import app
from lbs.cli.register import parse_at, parse_duration
from lbs.status import collect_status

from _pty import flat, invoke, rr  # noqa: F401


async def cli(*args: str) -> Result:
    """``lbs ARGS`` in-process on the ``lbs`` app itself (in a thread: the command runs its own loop)."""
    runner = CliRunner(env={"COLUMNS": "200"})
    return await asyncio.to_thread(runner.invoke, app, list(args), catch_exceptions=False)


pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def server_ms(r: aioredis.Redis) -> int:
    sec, usec = await r.time()
    return int(sec) * 1000 + int(usec) // 1000


async def test_register_now_writes_one_lbs_entry(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    result = await cli(
        "register", service, "job-1", "--info", '{"user": "u1"}', "--url", any_server.url
    )
    assert result.exit_code == 0, result.output
    entry_id = result.stdout.split("\t")[0]
    entries = await rr.xrange(_keys.input_stream(service))
    assert entries == [
        (entry_id.encode(), {b"lbs-input": b'{"DataStreamName":"job-1","Info":{"user":"u1"}}'})
    ]


async def test_register_in_ten_minutes_is_parked_and_status_shows_it(
    rr: aioredis.Redis, any_server: Any, service: str
) -> None:
    before = await server_ms(rr)
    result = await cli("register", service, "later", "--in", "10m", "--url", any_server.url)
    assert result.exit_code == 0, result.output
    parked = result.stdout.split("\t")[0]
    assert f"parked in {{{service}-input}}:delayed, due in 10m" in result.stdout
    score = await rr.zscore(_keys.due_key(service), parked)
    assert score is not None and before + 600_000 <= score <= await server_ms(rr) + 600_000
    assert await rr.exists(_keys.input_stream(service)) == 0

    at = (datetime.now(timezone.utc) + timedelta(hours=2)).isoformat()
    result = await cli("register", service, "at-two-hours", "--at", at, "--url", any_server.url)
    assert result.exit_code == 0, result.output

    st = await collect_status(any_server.url, service)
    assert st.delayed is not None and (st.delayed.parked, st.delayed.scheduled) == (2, 2)
    assert st.delayed.next_due_ms is not None and 0 < st.delayed.next_due_ms <= 600_000
    shown = await invoke("status", service, "--url", any_server.url)
    assert shown.exit_code == 0, shown.output
    assert "parked 2 (retries, scheduled registrations, delayed messages), next due in" in flat(
        shown.stdout
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--in", "-5"],
        ["--in", "soon"],
        ["--at", "noonish"],
        ["--in", "5", "--at", "09:00"],
        ["--info", "[1]"],
        ["--info", "{not json"],
    ],
    ids=["negative", "not-a-duration", "not-a-time", "both", "info-not-object", "info-not-json"],
)
async def test_a_wrong_command_line_exits_2_and_writes_nothing(
    rr: aioredis.Redis, any_server: Any, service: str, args: list[str]
) -> None:
    result = await cli("register", service, "x", *args, "--url", any_server.url)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert await rr.exists(_keys.input_stream(service), _keys.delayed_stream(service)) == 0


def test_durations_and_times() -> None:
    assert parse_duration("90") == timedelta(seconds=90)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    assert parse_duration("2d") == timedelta(days=2)
    for bad in ("", "-1", "inf", "nan", "1y", "5 m"):
        with pytest.raises(lbs.ConfigurationError):
            parse_duration(bad)
    now = datetime(2030, 1, 2, 10, 0, tzinfo=timezone.utc)
    assert parse_at("09:00", now) == datetime(2030, 1, 3, 9, 0, tzinfo=timezone.utc)
    assert parse_at("11:30", now) == datetime(2030, 1, 2, 11, 30, tzinfo=timezone.utc)
    assert parse_at("2030-01-02T09:00+01:00").utcoffset() == timedelta(hours=1)
    assert parse_at("2030-01-02T09:00").tzinfo is not None  # local time
