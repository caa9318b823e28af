"""A streaming query killed (``kill -9`` of its driver) around its sink's commit and restarted from its
checkpoint after the XADD IDMP window: every row exactly once, every stream registered once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

import lbs

pytestmark = pytest.mark.timeout(600)

QUERY = Path(__file__).with_name("_spark_query.py")
ROWS = 3_000
#: The sink's IDMP window in these runs (seconds): the restart comes after it.
IDMP_SECONDS = 1


def _driver(url: str, service: str, inputs: list[str], tmp: Path, options: dict[str, str]) -> Any:
    with open(tmp / "driver.log", "ab") as log:  # the child keeps its own copy
        return _start(url, service, inputs, tmp, options, log)


def _start(
    url: str, service: str, inputs: list[str], tmp: Path, options: dict[str, str], log: Any
) -> Any:
    return subprocess.Popen(
        [
            sys.executable,
            str(QUERY),
            url,
            service,
            ",".join(inputs),
            str(tmp / "checkpoint"),
            f"{service}-query",
            json.dumps({"idmpDuration": str(IDMP_SECONDS), **options}),
        ],
        start_new_session=True,  # its JVM and Python workers with it, for killpg
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


@pytest.mark.parametrize("where", ["commit-start", "commit-end"])
@pytest.mark.parametrize("server", ["redis_server", "redis7_server"])
def test_a_query_killed_around_its_commit_and_restarted_late_writes_every_row_once(
    service: str, server: str, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server).url
    inputs = [f"{service}-in-{i}" for i in range(3)]
    outs = [name + "-out" for name in inputs]
    with redis.Redis.from_url(url) as r:
        pipe = r.pipeline(transaction=False)
        for n in range(ROWS):
            pipe.xadd(inputs[n % len(inputs)], {"n": n})
        pipe.execute()

        # The first run writes the batch's rows, then stops at `where` of its commit and is killed.
        paused = tmp_path / "paused"
        first = _driver(url, service, inputs, tmp_path, {"_pauseAt": f"{where}:{paused}"})
        deadline = time.monotonic() + 300
        while not paused.exists():
            assert first.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the query never reached its commit"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        written = sum(r.xlen(name) for name in outs)
        assert written == ROWS  # all written before the kill: the rerun must add none
        time.sleep(IDMP_SECONDS + 1.5)  # past the IDMP window: XADD IDMP alone would append again

        second = _driver(url, service, inputs, tmp_path, {})
        assert second.wait(timeout=300) == 0, (tmp_path / "driver.log").read_text()[-3000:]

        got = [(name, f[b"src"].decode(), int(f[b"n"])) for name in outs for _, f in r.xrange(name)]
        registered = []
        for _, fields in r.xrange(lbs.input_stream(service)):
            name, _info, _err = lbs.try_decode_input(fields[b"lbs-input"])
            registered.append(name)
    assert len(got) == ROWS, f"{len(got) - ROWS:+d} rows: duplicates or losses"
    assert sorted(n for _, _, n in got) == list(range(ROWS))
    assert sorted(registered) == sorted(outs)  # each stream registered once, killed or not
