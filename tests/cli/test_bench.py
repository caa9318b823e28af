"""``lbs bench``: the assignment cycle of ``make bench``, small, on the test Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from lbs.embedded import free_port

from _cli_helpers import cli_env, flat, run_lbs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def _keys_of(r: aioredis.Redis, service: str) -> list[bytes]:
    return [k async for k in r.scan_iter(match=f"*{service}*")]


async def test_bench_prints_the_table_and_leaves_nothing(
    redis_server: Any, r: aioredis.Redis, service: str, tmp_path: Path
) -> None:
    proc = run_lbs(
        [
            "bench",
            "--url",
            redis_server.url,
            "--streams",
            "300",
            "--rounds",
            "2",
            "--service",
            service,
        ],
        cli_env(tmp_path / "log"),
    )
    assert proc.returncode == 0, proc.stderr
    out = flat(proc.stdout)
    assert "assignment cycle, 300 streams (times in " in out
    header = next(line for line in proc.stdout.splitlines() if "Name" in line)
    assert flat(header).split() == [
        "Name",
        "Min",
        "Max",
        "Mean",
        "StdDev",
        "Median",
        "Rounds",
        "per",
        "s",
        "client",
        "µs",
        "Redis",
        "µs",
    ]
    assert "client_cpu_us_per_assignment, redis_cpu_us_per_assignment" in out
    rows = [
        line
        for line in proc.stdout.splitlines()
        if "lbs run()" in line or "redis-py batched + Lua" in line
    ]
    assert len(rows) == 3, proc.stdout  # one row per side, and the comparison
    assert "lbs run(): " in out and "x the throughput of redis-py batched + Lua (by median)" in out
    assert f"Redis {'.'.join(map(str, redis_server.version))}" in out
    for side in ("lbs run()", "redis-py batched + Lua"):
        assert f"{side}: round 2/2" in proc.stderr
    assert await _keys_of(r, service) == []


async def test_bench_refuses_a_redis_with_keys_of_the_service_unless_forced(
    redis_server: Any, r: aioredis.Redis, service: str, tmp_path: Path
) -> None:
    await r.set(f"{service}-input", "someone's")
    args = [
        "bench",
        "--url",
        redis_server.url,
        "--streams",
        "20",
        "--rounds",
        "1",
        "--service",
        service,
    ]
    proc = run_lbs(args, cli_env(tmp_path / "log"))
    assert proc.returncode == 1
    assert (
        f"already has 1 key(s) of service {service!r} (e.g. {service}-input): pass --force"
        in flat(proc.stderr)
    )
    assert proc.stdout == ""
    proc = run_lbs([*args, "--force"], cli_env(tmp_path / "log"))
    assert proc.returncode == 0, proc.stderr
    assert await _keys_of(r, service) == [f"{service}-input".encode()]  # left alone
    assert await r.get(f"{service}-input") == b"someone's"


def test_bench_on_an_unreachable_redis_is_exit_1(tmp_path: Path) -> None:
    proc = run_lbs(
        ["bench", "--url", f"redis://:pw@127.0.0.1:{free_port()}", "--streams", "5"],
        cli_env(tmp_path / "log"),
    )
    assert proc.returncode == 1
    assert (
        "lbs bench: error: cannot connect to Redis at redis://:***@127.0.0.1" in flat(proc.stderr)
        and "pw@" not in proc.stderr
    )
    assert "Traceback" not in proc.stderr
