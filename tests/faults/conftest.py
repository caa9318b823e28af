"""Fixtures of the fault suite (tests/faults).

Every fault test starts its own redis-server (``_fleet.server``) so it may
kill, restart or stop it; ``report(figures)`` prints the test's one line of
figures and repeats it in the terminal summary, so ``make test`` shows them
too (``make faults`` runs the full size with ``-s``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from _fleet import SIZE, Figures

_LINES: list[str] = []


@pytest.fixture
def report() -> Callable[[Figures], None]:
    def emit(figures: Figures) -> None:
        line = figures.line()
        print(line, flush=True)
        _LINES.append(line)

    return emit


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LINES:
        terminalreporter.section(f"fault figures ({SIZE})")
        for line in _LINES:
            terminalreporter.write_line(line)
