"""The data source on a Spark standalone cluster, with a worker killed in the middle of a write.

A master and two workers (one core each) on loopback, started here with the installed wheel's own
pyspark (``bin/spark-class``; nothing downloaded), each in a process group of its own, so that
killing a worker's group also kills its executor's JVM. ``spark-submit --master spark://...``
runs ``_spark_cluster_job.py`` with its executors on the installed venv (``PYSPARK_PYTHON``: the
first documented way of shipping lbs, "installed on every node"; every node is this machine). The
job writes ROWS rows through the sink, slowly; once a task on one worker has KILL_AFTER of its rows
in Redis, the test kills that worker with SIGKILL, and Spark runs the task again on the other
worker. Then the job reads everything back with the batch reader and copies it with the streaming
reader (``availableNow``).

What it shows: every row is in Redis exactly once (Redis >= 8.6: XADD IDMP; the killed task's rows
were written twice), each data stream is registered once, both readers see every row, the
executors were JVMs of their own, one on each worker, and the killed one was lost. Every wait is a
bounded poll of Redis, of the master's /json/ or of the job's process; the cluster's teardown
leaves no process behind. About 75 s on 2 cores after the wheel's build and install:

    LBS_REDIS_SERVER=$(scripts/redis.sh) .venv/bin/python -m pytest tests/packaging/test_spark_cluster.py -s
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import lbs
from lbs.embedded import RedisServer, free_port

from _venvs import HERE, Started, Venv, clean_env

pytestmark = pytest.mark.timeout(900)  # the session's build and install come first

JOB = HERE / "_spark_cluster_job.py"
ROWS, STREAMS, PARTITIONS = 20_000, 200, 8
#: Rows per partition; the victim is killed once a task of its has this many rows in Redis.
PER, KILL_AFTER = ROWS // PARTITIONS, 500
#: Every wait of the test is bounded by this (seconds).
WAIT = 240.0
#: The JVMs' options: six short-lived JVMs share two cores here; without the C2 compiler's work and
#: the parallel collector's threads they start in half the time (nothing Spark does depends on it).
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _until(
    what: str, check: Callable[[], Any], timeout: float = WAIT, job: Started | None = None
) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` (and showing what
    ``job`` wrote) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(
                f"waited {timeout:.0f} s for {what}" + (f"\n{job.output()[-8000:]}" if job else "")
            )
        time.sleep(0.1)


@dataclass
class Node:
    """A master or a worker: its process group, web UI port and (a worker) work directory."""

    started: Started
    web: int
    work: Path


class Standalone:
    """A standalone master and its workers on 127.0.0.1, each a process group of its own."""

    def __init__(self, spark_home: Path, base: Path) -> None:
        self.spark_class = spark_home / "bin" / "spark-class"
        self.base = base
        self.env = clean_env(
            SPARK_HOME=str(spark_home), SPARK_DAEMON_MEMORY="512m", SPARK_DAEMON_JAVA_OPTS=JAVA_OPTS
        )
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.nodes: list[Node] = []
        self.workers: list[Node] = []
        self.ready_in = 0.0  # seconds from the master's start to all workers ALIVE

    def _start(self, cls: str, *args: str | Path, work: Path) -> Node:
        web = free_port()
        argv = [self.spark_class, f"org.apache.spark.deploy.{cls}", *args, "--webui-port", str(web)]
        node = Node(Started(argv, cwd=self.base, timeout=WAIT, env=self.env), web, work)
        self.nodes.append(node)
        return node

    def start(self, workers: int) -> None:
        """The master, then the workers once it answers; returns when they are all ALIVE."""
        began = time.monotonic()
        self.master = self._start(
            "master.Master", "--host", "127.0.0.1", "--port", str(self.port), work=self.base
        )
        _until("the master's web UI", self.state, job=self.master.started)
        for i in range(workers):
            work = self.base / f"worker-{i}"
            work.mkdir()
            args = ("--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--work-dir", work)
            self.workers.append(self._start("worker.Worker", self.url, *args, work=work))
        _until(f"{workers} workers alive", lambda: len(self.alive()) == workers)
        self.ready_in = time.monotonic() - began

    def state(self) -> dict[str, Any] | None:
        """The master's status (its web UI's /json/), None while it does not answer."""
        url = f"http://127.0.0.1:{self.master.web}/json/"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                state: dict[str, Any] = json.load(reply)
                return state
        except OSError:
            assert self.master.started.running(), self.master.started.output()[-4000:]
            return None

    def worker_states(self) -> dict[int, str]:
        """Each worker's state (ALIVE, DEAD, ...) by its web UI port."""
        workers = (self.state() or {}).get("workers", [])
        return {int(w["webuiaddress"].rsplit(":", 1)[1]): w["state"] for w in workers}

    def alive(self) -> list[int]:
        return [web for web, state in self.worker_states().items() if state == "ALIVE"]

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.started.stop()


def _strays(roots: list[Path]) -> list[str]:
    """Processes working in one of ``roots`` (executors, their Python workers) or naming one."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(proc / "cwd"))
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(cwd.is_relative_to(root) or str(root) in cmd for root in roots):
            found.append(f"{proc.name}: {cmd[:200]}")
    return found


@pytest.fixture
def cluster(installed: Venv, tmp_path: Path, workdir: Path) -> Iterator[Standalone]:
    """A master and two workers. At the end every process the cluster or the job started is gone:
    each group is killed, then what is left working in the cluster's or the job's directory (a
    pyspark daemon makes a group of its own and ends when its JVM's pipe closes) is waited for,
    killed after 30 s, and the test fails."""
    spark_home = next(installed.path.glob("lib/python*/site-packages/pyspark"))
    base = tmp_path / "standalone"
    base.mkdir()
    cluster = Standalone(spark_home, base)
    try:
        cluster.start(workers=2)
        yield cluster
    finally:
        cluster.stop()
        roots = [base, workdir]
        try:
            _until("the cluster's processes to end", lambda: not _strays(roots), 30)
        finally:
            for line in _strays(roots):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)


def _rows(r: Any, prefix: str) -> tuple[int, int]:
    """(duplicates, lost) of the ROWS rows in the streams ``<prefix>cj-*``: each (stream, n) once."""
    names = [f"{prefix}cj-{i:03d}" for i in range(STREAMS)]
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.xrange(name)
    seen = Counter(
        (name, int(fields[b"n"]))
        for name, entries in zip(names, pipe.execute())
        for _, fields in entries
    )
    want = {(f"{prefix}cj-{i % STREAMS:03d}", i) for i in range(ROWS)}
    assert set(seen) <= want, sorted(set(seen) - want)[:5]
    return sum(seen.values()) - len(seen), len(want - set(seen))


def _registered(r: Any, service: str) -> list[str]:
    return sorted(
        lbs.decode_input(f[lbs.INPUT_FIELD.encode()])[0]
        for _, f in r.xrange(lbs.input_stream(service))
    )


def _kill_mid_write(r: Any, job: Started, victim: Node) -> tuple[int, int, int]:
    """Once a task on the victim's executor has KILL_AFTER of its rows in Redis, SIGKILL the victim's
    process group (the worker and its executor JVM). Returns the partition killed mid-write, the
    rows in Redis then, and how many of them that partition's task had written.

    Partition p holds rows [p * PER, (p + 1) * PER) in order, and the sink sends them in order on
    one connection: its row KILL_AFTER - 1 in Redis means that the rows before it are too."""

    def has(i: int) -> bool:
        return any(int(f[b"n"]) == i for _, f in r.xrange(f"cj-{i % STREAMS:03d}"))

    def victim_mid_write() -> str | None:
        assert job.running(), job.output()[-8000:]
        for key, cwd in r.hgetall("job:attempts").items():
            part, attempt = map(int, key.decode().split("."))
            on_victim = Path(cwd.decode()).is_relative_to(victim.work)
            if on_victim and attempt == 0 and has(part * PER + KILL_AFTER - 1):
                return str(part)
        return None

    part = int(
        _until(f"{KILL_AFTER} rows of a task on the victim in Redis", victim_mid_write, job=job)
    )
    victim.started.stop()
    pipe = r.pipeline(transaction=False)
    for i in range(STREAMS):
        pipe.xrange(f"cj-{i:03d}")
    written = [int(f[b"n"]) for entries in pipe.execute() for _, f in entries]
    of_part = sum(1 for n in written if part * PER <= n < (part + 1) * PER)
    # The rest of the partition takes (PER - KILL_AFTER) / 100 pauses: seconds, not milliseconds.
    assert KILL_AFTER <= of_part < PER, f"the victim's task had written {of_part} rows"
    return part, len(written), of_part


def test_a_job_survives_a_worker_killed_mid_write_on_a_standalone_cluster(
    installed: Venv, own_redis: RedisServer, workdir: Path, cluster: Standalone
) -> None:
    victim, survivor = cluster.workers
    result = workdir / "result.json"
    job_file = shutil.copy(JOB, workdir / JOB.name)  # the tree stays out of the driver's reach
    began = time.monotonic()
    job = Started(
        [
            installed.bin / "spark-submit",
            *("--master", cluster.url, "--driver-memory", "512m", "--executor-memory", "512m"),
            *("--driver-java-options", JAVA_OPTS),
            *("--conf", f"spark.executor.extraJavaOptions={JAVA_OPTS}"),
            *("--conf", "spark.ui.enabled=false"),
            # Both executors before the first task (standalone's default ratio is 0: start at once).
            *("--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0"),
            *("--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=120s"),
            job_file,
            *(own_redis.url, result, workdir / "checkpoint", ROWS, STREAMS, PARTITIONS),
        ],
        cwd=workdir,
        timeout=WAIT * 3,
        env=clean_env(PYSPARK_PYTHON=str(installed.python)),
    )
    try:
        # 1. The worker killed mid-write; the master sees it go at once (its connection drops).
        with own_redis.client() as r:
            part, at_kill, twice = _kill_mid_write(r, job, victim)
        killed = time.monotonic()
        _until("the master to see the victim dead", lambda: victim.web not in cluster.alive())
        noticed = time.monotonic() - killed
        _until("the job to end", lambda: not job.running(), WAIT * 2, job=job)
        job.wait()  # its exit status
        log = job.output()
    finally:
        job.stop()
    (workdir / "driver.log").write_text(log)
    report = json.loads(result.read_text())
    print(
        f"standalone: up in {cluster.ready_in:.0f} s; {ROWS} rows; worker killed at {at_kill} "
        f"(partition {part} mid-write: {twice} of its rows written, and again by its retry), "
        f"seen dead by the master after {noticed:.1f} s; job {time.monotonic() - began:.0f} s; "
        f"{report}"
    )

    with own_redis.client() as r:
        attempts = {k.decode(): Path(v.decode()) for k, v in r.hgetall("job:attempts").items()}
        # 2. Exactly once: each (stream, n) once, in the written streams and in the copies (on
        #    Redis < 8.6 the sink is at-least-once: nothing lost); each stream registered once.
        exactly_once = own_redis.version >= (8, 6)
        for prefix in ("", "out-"):
            duplicates, lost = _rows(r, prefix)
            counts = f"{prefix}cj-*: {duplicates} duplicates, {lost} lost"
            assert (duplicates if exactly_once else 0, lost) == (0, 0), counts
        names = [f"cj-{i:03d}" for i in range(STREAMS)]
        assert _registered(r, "cluster") == names
        assert _registered(r, "copy") == [f"out-{n}" for n in names]
    # 3. The batch reader saw every row once; the streaming reader copied every row.
    assert (report["batch_rows"], report["batch_distinct"]) == (ROWS, ROWS)
    assert report["streamed_rows"] == ROWS

    # 4. The executors were JVMs of their own, one on each worker (<work dir>/<app>/<executor>/).
    executors = [{p.name for p in (w.work / report["app"]).iterdir()} for w in cluster.workers]
    assert all(executors) and not executors[0] & executors[1], executors
    # Every partition ran on one of them; the task killed mid-write ran again on the survivor (and
    # its first KILL_AFTER rows, written twice, are in Redis once: above).
    on = {
        w.work: {k for k, cwd in attempts.items() if cwd.is_relative_to(w.work)}
        for w in cluster.workers
    }
    assert on[victim.work] | on[survivor.work] == set(attempts)
    assert {k.split(".")[0] for k in attempts} == {str(p) for p in range(PARTITIONS)}
    assert f"{part}.0" in on[victim.work], attempts
    assert any(k.startswith(f"{part}.") for k in on[survivor.work]), attempts
    # The master lost the victim; the driver its executor.
    assert cluster.worker_states() == {victim.web: "DEAD", survivor.web: "ALIVE"}
    assert "Lost executor" in log, log[-8000:]
