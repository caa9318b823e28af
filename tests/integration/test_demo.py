"""The demo, in-process and through the command line on its own embedded Redis.

The command line runs step 1 as a Spark job when pyspark (and Java) are
there; the in-process run stands in for a machine without pyspark, so the
suite starts Spark once and covers both ways the work gets registered.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from lbs import _demo
from lbs._demo import POISON_MAX_RETRIES, run_demo

#: None when the demo's step 1 runs as a Spark job here (pyspark, pyarrow and a Java runtime).
SPARK_UNAVAILABLE = _demo._spark_unavailable()


async def test_demo_processes_everything_and_leaves_nothing(  # type: ignore[no-untyped-def]
        redis_server, service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a machine without pyspark: the producer registers the work.
    monkeypatch.setattr(_demo, "_spark_unavailable", lambda: "pyspark not installed (pip install 'lbs-streams[spark]')")
    lines: list[str] = []
    result = await run_demo(redis_server.url, service=service, streams=8, consumers=2, out=lines.append)
    assert result.ok, lines
    assert result.source == "producer"
    assert lines[0] == "pyspark not installed (pip install 'lbs-streams[spark]'): registering with lbs.Producer instead"
    # 8, the two handed back on shutdown, and the one whose consumer was killed
    assert sum(result.processed.values()) == 8 + 2 + 1
    assert (result.leftover_pending, result.leftover_entries, result.leftover_locks) == (0, 0, 0)
    assert any("registered 8 data streams" in line for line in lines)
    assert any("session-3 (token" in line and "user u2" in line for line in lines), lines
    assert result.handed_back >= 1
    assert result.crash_recovery_s > 0 and any("killed with SIGKILL" in line for line in lines)
    # the malformed entry and the poison pill, after its first attempt and max_retries retries
    assert result.dead_letters == 2 and result.poison_retries == POISON_MAX_RETRIES + 1


@pytest.mark.timeout(900)
def test_demo_command_on_an_embedded_redis() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lbs", "demo", "--streams", "4"],
        capture_output=True, text=True, timeout=800,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "embedded Redis 8." in proc.stdout
    if SPARK_UNAVAILABLE is None:
        # The pipeline starts from a Spark job: the lbs sink wrote the events and registered the streams.
        assert "spark: the work came from a Spark job: the lbs sink appended 12 rows (events) to 4 data streams " \
               "and registered 4 data streams in demo-input" in proc.stdout, proc.stdout
        assert "Spark stopped" in proc.stdout
        # registered with an empty Info: the handler found the users in the events
        assert "session-2 (token" in proc.stdout and "user u1)" in proc.stdout
    else:
        assert f"{SPARK_UNAVAILABLE}: registering with lbs.Producer instead" in proc.stdout
    assert "malformed entry" in proc.stdout and "dead letter: '{not json'" in proc.stdout
    assert proc.stdout.rstrip().endswith("lbs demo: OK")


def test_help_describes_the_demo() -> None:
    out = subprocess.run([sys.executable, "-m", "lbs", "demo", "--help"], capture_output=True, text=True, check=True).stdout
    assert "Spark job" in " ".join(out.split())
    for option in ("--streams", "--consumers", "--service", "--redis-url"):
        assert option in out
