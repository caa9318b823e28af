"""The reader's fuzzer (tests/unit/_fuzz.py) runs briefly in every test run,
so it cannot rot; `make fuzz` runs it for ten minutes."""

from __future__ import annotations

import _fuzz


def test_fuzzer_finds_nothing_in_a_few_seconds() -> None:
    stats = _fuzz.fuzz(seconds=3.0, seed=20261122)
    assert stats.inputs > 1000, stats  # it did run
    assert stats.replies > 0 and stats.protocol_errors > 0, stats  # and reached both outcomes
    assert not stats.findings, stats.findings[0]
