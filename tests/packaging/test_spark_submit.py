"""examples/spark_job.py run as a user runs it: `spark-submit` from the fresh venv of the
installed wheel (its own pyspark), against a real Redis, ending by itself. The executors'
Python gets lbs in one of the two documented ways: a venv with lbs-streams installed
(PYSPARK_PYTHON), or a packed venv shipped with --archives."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

import lbs
from lbs.embedded import RedisServer

from _pyprojects import ROOT, ROOT_PYPROJECT
from _venvs import Dist, Venv, clean_env, run

pytestmark = pytest.mark.timeout(900)  # the session's build and install come first

JOB = ROOT / "examples" / "spark_job.py"


def _submit(
    installed: Venv,
    workdir: Path,
    server: RedisServer,
    master: str,
    env: dict[str, str],
    *spark_args: str,
) -> subprocess.CompletedProcess[str]:
    """Seed a worker's result, submit a copy of the job (the tree stays out of reach), check what it wrote."""
    job = Path(shutil.copy(JOB, workdir / JOB.name))
    with server.client() as r:
        result_id = r.xadd("results", {"total": "12"})
    proc = run(
        [
            installed.bin / "spark-submit",
            "--master",
            master,
            "--conf",
            "spark.ui.enabled=false",
            *spark_args,
            job,
            server.url,
            workdir / "checkpoint",
        ],
        cwd=workdir,
        env=env,
        timeout=600,
    )
    with server.client() as r:
        # 1. The sink: one entry per row, each stream registered once in the service's LBS.
        assert [r.xlen(s) for s in ("session-1", "session-2")] == [1, 1]
        registered = [
            lbs.decode_input(f[lbs.INPUT_FIELD.encode()])[0]
            for _, f in r.xrange(lbs.input_stream("orders"))
        ]
        assert sorted(registered) == ["session-1", "session-2"]
        # 3. The streaming query took the result and wrote the report, then the job ended.
        ((_, report),) = r.xrange("report")
        assert report == {b"src": result_id, b"total": b"12"}
    # 2. The batch readers, as the job printed them.
    assert "entries: [('session-1', 'click', 3), ('session-2', 'buy', 9)]\n" in proc.stdout, (
        proc.stdout
    )
    assert "dead letters: 0\n" in proc.stdout
    return proc


def test_the_example_job_runs_with_executors_on_the_installed_venv(
    installed: Venv, own_redis: RedisServer, workdir: Path
) -> None:
    _submit(
        installed, workdir, own_redis, "local[2]", clean_env(PYSPARK_PYTHON=str(installed.python))
    )


def _pack(dist: Dist, base: Path) -> Path:
    """A venv with lbs-streams and pyarrow (pyspark comes from the cluster's Spark), packed by venv-pack."""
    env = Venv.create(base / "lbs-env")
    spark_extra = [
        r for r in ROOT_PYPROJECT["project"]["optional-dependencies"]["spark"] if "pyspark" not in r
    ]
    env.pip_install(dist.wheel, *spark_extra)
    archive = base / "lbs-env.tar.gz"
    run(
        [sys.executable, "-m", "venv_pack", "--quiet", "-p", env.path, "-o", archive],
        cwd=base,
        timeout=300,
    )
    return archive


@pytest.fixture(scope="session", autouse=True)
def packing(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future[Path]]:
    """The packed venv, built in a thread from the first test of this module on: autouse, so it
    starts before the session's ``installed`` venv and the two pip installs share the two cores."""
    base = tmp_path_factory.mktemp("packed")
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_pack, dist, base)


@pytest.fixture(scope="session")
def packed_env(packing: Future[Path]) -> Path:
    return packing.result()


def test_the_example_job_runs_with_executors_on_a_packed_venv_shipped_by_archives(
    installed: Venv, packed_env: Path, own_redis: RedisServer, workdir: Path
) -> None:
    # local-cluster: executors are JVMs of their own, each starting its Python workers in its
    # own directory, where Spark unpacks the archive (in local[N] the executor is the driver
    # JVM and the archive lands elsewhere). The driver's JVM runs Python too (the data
    # source's planning and commit, with the same PYSPARK_PYTHON): in client mode the
    # archive is unpacked beside the driver as well.
    (workdir / "environment").mkdir()
    run(["tar", "-xzf", packed_env, "-C", workdir / "environment"], cwd=workdir, timeout=300)
    env = clean_env(
        PYSPARK_PYTHON="./environment/bin/python", PYSPARK_DRIVER_PYTHON=str(installed.python)
    )
    _submit(
        installed,
        workdir,
        own_redis,
        "local-cluster[1,2,1024]",
        env,
        "--archives",
        f"{packed_env}#environment",
    )
    # The executor (cwd: the worker's work dir under Spark's home) unpacked its own copy.
    work = next(installed.path.glob("lib/python*/site-packages/pyspark")) / "work"
    assert list(work.glob("app-*/*/environment/bin/python")), (
        "the executor did not unpack the archive"
    )
