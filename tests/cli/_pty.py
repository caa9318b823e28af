"""Running the ``lbs`` commands in tests: in-process (typer's CliRunner, on an app of their own, so
they do not depend on which app registers them) or in a pseudo-terminal (``--watch``), with bounded waits.

Importing it also makes the integration tests' ``_helpers`` importable, and gives the ``rr`` fixture
(import it into the test module).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
import typer
from typer.testing import CliRunner, Result

from lbs.cli import dlq
from lbs.cli.status import claim, status


@pytest.fixture
async def rr(any_server: Any) -> AsyncIterator[aioredis.Redis]:
    """A redis-py client on ``any_server``: the test runs on Redis 8.x, then on Debian's 7.0."""
    async with aioredis.Redis.from_url(any_server.url) as c:
        yield c


#: ``python -c`` source of a process that runs the commands on an app of its own.
APP_MAIN = (
    "import sys, typer; from lbs.cli import dlq; from lbs.cli.status import claim, status; "
    "app = typer.Typer(); app.command('status')(status); app.command('claim')(claim); "
    "app.add_typer(dlq.app, name='dlq'); sys.exit(app(prog_name='lbs'))"
)


def make_app() -> typer.Typer:
    """The commands of this change on a typer app of the test's own."""
    app = typer.Typer()
    app.command("status")(status)
    app.command("claim")(claim)
    app.add_typer(dlq.app, name="dlq")
    return app


async def invoke(*args: str, input: str | None = None) -> Result:
    """Run ``lbs <args>`` in-process (in a thread: the commands run their own event loop), 200 columns wide."""
    runner = CliRunner(env={"COLUMNS": "200", "LINES": "100"})
    return await asyncio.to_thread(
        runner.invoke, make_app(), list(args), input=input, catch_exceptions=False
    )


def flat(text: str) -> str:
    """``text`` without box-drawing characters, its whitespace collapsed: what a sentence says, however wrapped."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())


def app_argv(*args: str) -> list[str]:
    """The argv of a child process running ``lbs <args>`` on the test's own app."""
    return [sys.executable, "-c", APP_MAIN, *args]


#: CSI and OSC escape sequences (colours, cursor moves, window titles).
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def plain(text: str) -> str:
    """``text`` without terminal escape sequences."""
    return _ANSI.sub("", text)


class Terminal:
    """A child process whose stdin, stdout and stderr are a pseudo-terminal of ``rows`` x ``cols``."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        rows: int = 50,
        cols: int = 120,
    ) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        full_env = {
            **os.environ,
            "TERM": "xterm-256color",
            "COLUMNS": str(cols),
            "LINES": str(rows),
            **(env or {}),
        }
        full_env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            list(argv),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=full_env,
            start_new_session=True,
            close_fds=True,
        )
        os.close(slave)
        self.output = ""

    def read_until(self, done: Callable[[str], bool], timeout: float) -> str:
        """Read the screen until ``done(plain screen so far)``; AssertionError after ``timeout`` s or at EOF."""
        deadline = time.monotonic() + timeout
        while not done(plain(self.output)):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"not seen within {timeout}s; the screen so far:\n{plain(self.output)[-3000:]}"
                )
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the child closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(
                    f"the process ended (exit code {self.proc.poll()}) before; its screen:\n"
                    f"{plain(self.output)[-3000:]}"
                )
            self.output += chunk.decode("utf-8", "replace")
        return plain(self.output)

    def interrupt(self, timeout: float = 20.0) -> int:
        """Ctrl-C (SIGINT to the process) and its exit code, reading the rest of its output meanwhile."""
        self.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.output += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:
                    break
        return self.proc.wait(max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)


async def watched(
    argv: Sequence[str], until: Callable[[str], bool], cols: int = 120
) -> tuple[str, int]:
    """``argv`` run in a :class:`Terminal` (``cols`` wide) until its screen is ``until`` (60 s at
    most), then interrupted (Ctrl-C): the screen and the exit code. The terminal is closed after."""
    term = Terminal(argv, cols=cols)
    try:
        screen = await asyncio.to_thread(term.read_until, until, 60)
        code = await asyncio.to_thread(term.interrupt)
    finally:
        term.close()
    return screen, code
