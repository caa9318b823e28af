"""``lbs worker --processes N``: a supervisor of N worker processes.

* Each child is ``python -m lbs.cli._child`` (the same interpreter), given its
  settings as JSON on stdin (so a password in the URL shows in no process
  list), and runs :func:`lbs.cli.serving.run_in_process` with consumer id
  ``<id>-<slot>``; its environment adds ``LBS_WORKER_SLOT`` and
  ``LBS_WORKER_PROCESSES`` (:func:`lbs.plugins.worker_slot`), so a plugin
  serving a port per process offsets it (lbs-prometheus: its port + slot). A restarted child keeps its slot's id, so it re-queues
  what its predecessor left pending (once the dead one's lease has expired,
  within ``lock_ttl``).
* Children run in their own session: a terminal's Ctrl-C reaches only the
  supervisor, which forwards it once (a second signal, forwarded too, cuts
  the children's drain short). A child gets SIGTERM if the supervisor dies
  (``PR_SET_PDEATHSIG``), so it hands its streams back.
* A child that exits 0 stopped on request (a signal sent to it directly) and
  is not restarted. One that exits 2 or 78 (usage, configuration) would fail
  the same way again: the supervisor stops the others and exits with that
  code. Any other exit (a crash, ``kill -9``) is restarted after a back-off
  of 0.5 s, doubling up to 30 s; the count of crashes resets once a child has
  run 60 s, and the fifth crash in a row stops the others and exits 1.
* SIGTERM/SIGINT to the supervisor are forwarded to every child; it exits once
  all have ended: 0 when each stopped cleanly (exit 0, or ended by the
  forwarded signal before it had started), 1 otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys

from .._waits import wait_set
from ..plugins import WORKER_PROCESSES_ENV, WORKER_SLOT_ENV
from ._common import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from .settings import WorkerSettings

__all__ = ["MAX_QUICK_CRASHES", "RESTART_INITIAL", "RESTART_MAX", "STABLE_AFTER", "supervise"]

log = logging.getLogger("lbs.supervisor")

#: The first restart's delay (seconds); it doubles per crash in a row, up to RESTART_MAX.
RESTART_INITIAL = 0.5
RESTART_MAX = 30.0
#: A child that ran this long (seconds) before it crashed resets its slot's count of crashes.
STABLE_AFTER = 60.0
#: This many crashes in a row of a slot (none of them after a stable run) end the supervisor with exit code 1.
MAX_QUICK_CRASHES = 5

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


class Supervisor:
    """Starts, restarts and stops the worker processes of one ``lbs worker --processes N``."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.live: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = asyncio.Event()
        self.fatal: int | None = None
        self.signals = 0

    def stop(self, sig: signal.Signals) -> None:
        """Stop restarting; send ``sig`` to every live child."""
        self.stopping.set()
        for proc in list(self.live.values()):
            if proc.returncode is None:
                try:
                    proc.send_signal(sig)
                except ProcessLookupError:  # it has just exited
                    pass

    def _on_signal(self, sig: signal.Signals) -> None:
        self.signals += 1
        if self.signals == 1:
            log.warning(
                "%s: stopping %d worker processes (drain, then hand back)", sig.name, len(self.live)
            )
        else:
            log.warning("%s again: forwarded, the workers cut their drain short", sig.name)
        self.stop(sig)

    async def _spawn(self, slot: int, first: bool) -> asyncio.subprocess.Process:
        s = self.settings
        child = dataclasses.replace(
            s,
            consumer_id=f"{s.consumer_base}-{slot}",
            banner=slot == 0 and first,
            slot=slot,
            parent_pid=os.getpid(),
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "lbs.cli._child",
            stdin=asyncio.subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, WORKER_SLOT_ENV: str(slot), WORKER_PROCESSES_ENV: str(s.processes)},
        )
        assert proc.stdin is not None
        try:
            proc.stdin.write(child.to_json().encode() + b"\n")
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):  # it died at once; its exit code tells
            pass
        log.info("worker %d started (pid %d, consumer id %s)", slot, proc.pid, child.consumer_id)
        return proc

    async def _slot(self, slot: int) -> int:
        """Keep slot ``slot`` running until a stop; its last exit code (0 when stopped between two runs)."""
        loop = asyncio.get_running_loop()
        crashes = 0
        first = True
        while True:
            proc = await self._spawn(slot, first)
            first = False
            self.live[slot] = proc
            if self.stopping.is_set():  # the stop came while it was being started
                self.stop(signal.SIGTERM)
            started = loop.time()
            code = await proc.wait()
            del self.live[slot]
            if self.stopping.is_set():
                log.info("worker %d (pid %d) %s", slot, proc.pid, _describe(code))
                return code
            if code == EXIT_OK:
                log.info(
                    "worker %d (pid %d) stopped by itself (exit 0); not restarted", slot, proc.pid
                )
                return code
            if code in (EXIT_USAGE, EXIT_CONFIG):
                log.error(
                    "worker %d (pid %d) %s (%s): it would again; stopping the others",
                    slot,
                    proc.pid,
                    _describe(code),
                    "usage" if code == EXIT_USAGE else "configuration",
                )
                self.fatal = self.fatal or code
                self.stop(signal.SIGTERM)
                return code
            crashes = 1 if loop.time() - started >= STABLE_AFTER else crashes + 1
            if crashes >= MAX_QUICK_CRASHES:
                log.error(
                    "worker %d (pid %d) %s, its crash %d in a row: giving up; stopping the others",
                    slot,
                    proc.pid,
                    _describe(code),
                    crashes,
                )
                self.fatal = self.fatal or EXIT_FAILURE
                self.stop(signal.SIGTERM)
                return code
            delay = min(RESTART_MAX, RESTART_INITIAL * 2 ** (crashes - 1))
            log.warning(
                "worker %d (pid %d) %s; restarting it in %.1fs",
                slot,
                proc.pid,
                _describe(code),
                delay,
            )
            if await wait_set(self.stopping, delay):
                return EXIT_OK  # stopped while waiting: nothing was running

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in _STOP_SIGNALS:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            log.info(
                "supervisor (pid %d): starting %d worker processes",
                os.getpid(),
                self.settings.processes,
            )
            codes = await asyncio.gather(*(self._slot(i) for i in range(self.settings.processes)))
        finally:
            for sig in _STOP_SIGNALS:
                loop.remove_signal_handler(sig)
        if self.fatal is not None:
            return self.fatal
        clean = all(code == EXIT_OK or -code in _STOP_SIGNALS for code in codes)
        log.info("supervisor: every worker has ended (%s)", ", ".join(map(str, codes)))
        return EXIT_OK if clean else EXIT_FAILURE


def supervise(settings: WorkerSettings) -> int:
    """Run the supervisor until every child has ended; its exit code."""
    return asyncio.run(Supervisor(settings).run())
