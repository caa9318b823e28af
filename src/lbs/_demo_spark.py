"""Step 1 of the demo with Spark: a local Spark job writes the work with the lbs sink, in a child
process (``python -m lbs._demo_spark URL SERVICE``, the rows as JSON on its stdin), so the JVM, its
start-up chatter and its threads stay out of the demo's process (see :mod:`lbs._demo`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable

__all__ = [
    "SPARK_JOB_TIME",
    "SPARK_MASTER",
    "SPARK_TIMEOUT",
    "Row",
    "spark_unavailable",
    "spark_write",
]

#: Told what a long step is doing (a status line, shown with a spinner), or None when it is over.
Progress = Callable[[str | None], None]

#: The Spark job's master: a local Spark with two worker threads.
SPARK_MASTER = "local[2]"
#: How long the Spark job may take, session start included (a busy 2-core machine is slow).
SPARK_TIMEOUT = 600.0
#: How long the Spark job takes, session start included, measured on a 2-core machine: 22-45 s
#: beside nothing, two busy processes or the team's work, up to 60 s seen under more (what the user is told).
SPARK_JOB_TIME = "20-60 s"

#: One row per event: the data stream it belongs to, then its payload fields.
Row = tuple[str, int, str]


def spark_unavailable() -> str | None:
    """Why the demo cannot write its work with Spark here, or None when it can."""
    try:
        import pyarrow  # noqa: F401

        from . import spark  # noqa: F401 - needs pyspark >= 4.0
    except ImportError:
        return "pyspark not installed (pip install 'lbs-streams[spark]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "pyspark is installed but Spark needs a Java runtime (none on PATH, no JAVA_HOME)"
    return None


async def spark_write(
    url: str, service: str, rows: list[Row], progress: Progress | None = None
) -> dict[str, float]:
    """Run :func:`_spark_job` in a child process; return its timings (seconds), ``total_s`` included.

    A child process keeps Spark's JVM, its start-up chatter on stderr and its
    threads out of the demo's process; the JVM exits with it. The child says
    on stdout what it is doing (one JSON object a line, ``{"stage": ...}``),
    and ``progress`` hears it with the time so far, every half second.
    """
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lbs._demo_spark",
        url,
        service,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdout: asyncio.StreamReader = proc.stdout
    stage = "starting the JVM and a local Spark session"
    reports: list[dict[str, float]] = []

    async def read_reports() -> None:
        nonlocal stage
        async for raw in stdout:
            try:
                report = json.loads(raw)
            except ValueError:
                continue  # not one of ours (a library's print)
            if "stage" in report:
                stage = str(report["stage"])
            else:
                reports.append(report)

    reader, errors = asyncio.create_task(read_reports()), asyncio.create_task(proc.stderr.read())
    exited = asyncio.create_task(proc.wait())
    stderr = b""
    try:
        proc.stdin.write(json.dumps(rows).encode())
        await proc.stdin.drain()
        proc.stdin.close()
        while not exited.done():
            elapsed = time.perf_counter() - started
            if elapsed > SPARK_TIMEOUT:
                raise RuntimeError(f"the Spark job did not finish within {SPARK_TIMEOUT:.0f} s")
            if progress is not None:
                # The time first: a narrow terminal cuts the end of the line.
                progress(f"spark {elapsed:.0f} s (takes {SPARK_JOB_TIME}): {stage}")
            await asyncio.wait((exited,), timeout=0.5)
        await asyncio.wait(
            (reader, errors), timeout=30
        )  # the pipes are at EOF once the child has exited
        stderr = errors.result() if errors.done() else b""
    finally:
        if progress is not None:
            progress(None)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for task in (reader, errors, exited):
            task.cancel()
    if proc.returncode != 0 or not reports:
        tail = "\n".join(stderr.decode(errors="replace").strip().splitlines()[-20:])
        raise RuntimeError(f"the Spark job exited with {proc.returncode}:\n{tail}")
    timings = reports[-1]
    timings["total_s"] = time.perf_counter() - started
    return timings


def _spark_job(url: str, service: str, rows: list[Row]) -> dict[str, float]:
    """Step 1's Spark job: write ``rows`` with the lbs sink, stop the session; return the timings.

    Says what it is doing on stdout as it goes (``{"stage": ...}`` lines), for :func:`spark_write`.
    """
    from .spark import local_session

    def stage(text: str) -> None:
        print(json.dumps({"stage": text}), flush=True)

    started = time.perf_counter()
    spark = local_session(SPARK_MASTER, app_name="lbs-demo")
    ready = time.perf_counter()
    try:
        stage(f"writing {len(rows)} rows with the lbs sink (session up in {ready - started:.0f} s)")
        df = spark.createDataFrame(rows, "stream string, value long, user string")
        df.write.format("lbs").option("url", url).option("service", service).mode("append").save()
        written = time.perf_counter()
        stage("written; stopping Spark")
    finally:
        spark.stop()
    return {"start_s": ready - started, "write_s": written - ready}


if __name__ == "__main__":
    rows_in = [(str(s), int(v), str(u)) for s, v, u in json.load(sys.stdin)]
    print(json.dumps(_spark_job(sys.argv[1], sys.argv[2], rows_in)), flush=True)
