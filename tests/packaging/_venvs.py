"""Running things outside the tree: a clean environment, a fresh venv, the release files."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import tempfile
import time
import venv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: The variables that could point a child at the tree, the dev venv or another Spark.
_LEAKY = (
    "PYTHONPATH",
    "PYTHONHOME",
    "VIRTUAL_ENV",
    "SPARK_HOME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what could leak the tree or the dev venv in."""
    env = {k: v for k, v in os.environ.items() if k not in _LEAKY}
    env.update(SPARK_LOCAL_IP="127.0.0.1", **extra)  # loopback only
    return env


def run(
    argv: Sequence[str | Path],
    *,
    cwd: Path,
    timeout: float,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; a failure shows its output."""
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env or clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{argv} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return proc


class Started:
    """A command started in the background, its output kept in a file: ``wait()`` where its result
    is needed fails as :func:`run` does; ``stop()`` kills it if it is still running (a session
    that never needed it)."""

    def __init__(
        self,
        argv: Sequence[str | Path],
        *,
        cwd: Path,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self._deadline = time.monotonic() + timeout
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self._proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=env or clean_env(),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() ends what it started too
        )

    def wait(self) -> None:
        try:
            code = self._proc.wait(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        self._out.seek(0)
        output = self._out.read().decode(errors="replace")
        assert code == 0, f"{self.argv} exited {code}\n{output[-8000:]}"

    def running(self) -> bool:
        return self._proc.poll() is None

    def output(self) -> str:
        """What it has written so far (read without moving the offset it writes at)."""
        fd = self._out.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")

    def stop(self) -> None:
        """Kill its process group (SIGKILL) if it is still running."""
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        if not self._out.closed:
            self._out.close()


@dataclass(frozen=True)
class Dist:
    """The files `make wheel` leaves in dist/."""

    path: Path

    @property
    def wheel(self) -> Path:
        (whl,) = self.path.glob("lbs_streams-*-manylinux*.whl")
        return whl

    @property
    def sdist(self) -> Path:
        (tgz,) = self.path.glob("lbs_streams-*.tar.gz")
        return tgz


@dataclass(frozen=True)
class Venv:
    """A venv of its own, made from this interpreter's base Python."""

    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @classmethod
    def create(cls, path: Path) -> Venv:
        venv.create(path, with_pip=False)
        # ensurepip runs the interpreter venv just copied. A process forked elsewhere in this one
        # while the copy was open for writing holds that file open a moment: ETXTBSY ("Text file
        # busy") until it execs. Wait it out (bounded) rather than fail the test on it.
        for attempt in range(20):
            try:
                subprocess.run(
                    [str(path / "bin" / "python"), "-m", "ensurepip", "--default-pip"],
                    check=True,
                    capture_output=True,
                    timeout=300,
                )
                break
            except OSError as exc:
                if exc.errno != errno.ETXTBSY or attempt == 19:
                    raise
                time.sleep(0.25)
        return cls(path)

    def pip_install(self, *requirements: str | Path, find_links: Path | None = None) -> None:
        links = ["--find-links", str(find_links)] if find_links else []
        run(
            [self.python, "-m", "pip", "install", "--quiet", *links, *map(str, requirements)],
            cwd=self.path,
            timeout=900,
        )
