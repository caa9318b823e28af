"""A worker process of ``lbs worker --processes N`` (see :mod:`lbs.cli.supervisor`).

Run as ``python -m lbs.cli._child`` with its :class:`lbs.cli.settings.WorkerSettings`
as one JSON line on stdin; its exit code is the worker's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def _stop_with_supervisor(supervisor: int | None) -> None:
    """SIGTERM when the supervisor dies (kill -9 included), so this worker hands its streams back."""
    if supervisor is None or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != supervisor:  # it died before prctl took effect
        sys.exit(0)


def main() -> int:
    from ._common import setup_logging
    from .serving import run_in_process
    from .settings import WorkerSettings

    settings = WorkerSettings.from_json(sys.stdin.readline())
    _stop_with_supervisor(settings.parent_pid)
    setup_logging(settings.log_level, settings.log_format)
    return run_in_process(settings)


if __name__ == "__main__":
    sys.exit(main())
