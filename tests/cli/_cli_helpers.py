"""Helpers of tests/cli: the ``lbs`` command run as a user runs it, ``python -m lbs ...`` in a subprocess.

* :func:`run_lbs` runs a command to completion; :class:`Proc` is one running
  in the background, :class:`Procs` starts them and kills them all (the
  ``start_worker`` fixture in conftest.py starts ``lbs worker`` that way, and
  kills it at teardown whatever happened).
* Processes run from the repository's root with it on ``PYTHONPATH``, so
  ``tests.cli._handlers:ok`` imports; ``LBS_TEST_LOG`` names the file the
  handlers write to; ``LBS_LOAD_PLUGINS`` is empty, so the entry-point
  plugins installed on this machine stay out, and no ``LBS_*`` setting of the
  developer's environment leaks in.
* Waits are bounded: a condition polled until a deadline (:func:`eventually`),
  a process waited for with a timeout.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

import lbs

ROOT = Path(__file__).resolve().parents[2]
#: The handlers' module, as the worker imports it.
HANDLERS = "tests.cli._handlers"
#: Generous for a loaded 2-core machine: a worker process starts (imports) in about a second.
START_TIMEOUT = 60.0


def cli_env(log: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("LBS_") or k == "LBS_REDIS_SERVER"
    }
    env.update(PYTHONPATH=str(ROOT), LBS_TEST_LOG=str(log), LBS_LOAD_PLUGINS="", COLUMNS="120")
    env.update(extra)
    return env


def flat(text: str) -> str:
    """``text`` without rich's box drawing and with single spaces: what a wrapped panel or table says."""
    return " ".join(re.sub("[\u2500-\u257f]", " ", text).split())


def run_lbs(
    args: list[str], env: dict[str, str], timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``python -m lbs ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "lbs", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float = START_TIMEOUT
) -> None:
    """Poll ``check`` until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)


@dataclass
class Proc:
    """A background ``lbs`` process, its stdout and stderr going to files (no pipe to fill up)."""

    popen: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)

    async def wait(self, timeout: float = 60.0) -> int:
        """The exit code, waited for without blocking the event loop."""
        return await asyncio.wait_for(asyncio.to_thread(self.popen.wait), timeout)

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def out(self) -> str:
        return self.stdout.read_text(errors="replace")

    def children(self) -> set[int]:
        """The pids of this process's live children (from /proc)."""
        found = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                # pid (comm) state ppid ...: comm may hold spaces, so split after its ")"
                fields = stat.rpartition(")")[2].split()
                if int(fields[1]) == self.pid and fields[0] != "Z":
                    found.add(int(entry.name))
        return found


class Procs:
    """``python -m lbs ARGS`` processes started in the background, all killed (with any children
    of a supervisor) by :meth:`kill_all`: the ``start_worker`` and ``lbs_proc`` fixtures' body."""

    def __init__(self, tmp_path: Path, env: dict[str, str], prefix: tuple[str, ...] = ()) -> None:
        self.tmp_path, self.env, self.prefix = tmp_path, env, prefix
        self.procs: list[Proc] = []

    def start(self, *args: str, **env: str) -> Proc:
        n = len(self.procs)
        out, err = self.tmp_path / f"proc{n}.out", self.tmp_path / f"proc{n}.err"
        with out.open("wb") as o, err.open("wb") as e:
            popen = subprocess.Popen(
                [sys.executable, "-m", "lbs", *self.prefix, *args],
                cwd=ROOT,
                env={**self.env, **env},
                stdout=o,
                stderr=e,
            )
        self.procs.append(Proc(popen, out, err))
        return self.procs[-1]

    def kill_all(self) -> None:
        for proc in self.procs:
            children = proc.children() if proc.popen.poll() is None else set()
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(timeout=30)
            for pid in children:  # a supervisor's, in their own session: make sure they stop
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def handled(log: Path, event: str = "done") -> list[list[str]]:
    """The handlers' lines of ``event``: ``[pid, stream, retry_count]`` each."""
    return [
        line.split()[1:] for line in log.read_text().splitlines() if line.startswith(event + " ")
    ]


async def all_finished(r: aioredis.Redis, service: str, shards: int = 1) -> bool:
    """Whether every registered stream of ``service`` (each shard) is finished: acked and deleted."""
    for svc in lbs.shard_services(service, shards):
        stream = lbs.input_stream(svc)
        if await r.xlen(stream) or (await r.xpending(stream, lbs.group_name(svc)))["pending"]:
            return False
    return True


async def leftovers(r: aioredis.Redis, service: str) -> tuple[int, int]:
    """``(pending, consumers' leases)`` of ``service``: both 0 once every worker has stopped cleanly."""
    stream, group = lbs.input_stream(service), lbs.group_name(service)
    pending = (await r.xpending(stream, group))["pending"] if await r.exists(stream) else 0
    leases = [k async for k in r.scan_iter(match=lbs.lease_key(service, "*"))]
    return pending, len(leases)
