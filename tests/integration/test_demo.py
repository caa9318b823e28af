"""The demo, in-process and through the command line on its own embedded Redis."""

from __future__ import annotations

import subprocess
import sys

from lbs._demo import POISON_MAX_RETRIES, run_demo


async def test_demo_processes_everything_and_leaves_nothing(redis_server, service: str) -> None:  # type: ignore[no-untyped-def]
    lines: list[str] = []
    result = await run_demo(redis_server.url, service=service, streams=8, consumers=2, out=lines.append)
    assert result.ok, lines
    # 8, the two handed back on shutdown, and the one whose consumer was killed
    assert sum(result.processed.values()) == 8 + 2 + 1
    assert (result.leftover_pending, result.leftover_entries, result.leftover_locks) == (0, 0, 0)
    assert any("registered 8 data streams" in line for line in lines)
    assert result.handed_back >= 1
    assert result.crash_recovery_s > 0 and any("killed with SIGKILL" in line for line in lines)
    # the malformed entry and the poison pill, after its first attempt and max_retries retries
    assert result.dead_letters == 2 and result.poison_retries == POISON_MAX_RETRIES + 1


def test_demo_command_on_an_embedded_redis() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lbs", "demo", "--streams", "4"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "embedded Redis 8." in proc.stdout
    assert proc.stdout.rstrip().endswith("lbs demo: OK")


def test_help_describes_the_demo() -> None:
    out = subprocess.run([sys.executable, "-m", "lbs", "demo", "--help"], capture_output=True, text=True, check=True).stdout
    for option in ("--streams", "--consumers", "--service", "--redis-url"):
        assert option in out
