"""benchmarks/report.py: each group's rows beside its baseline, with the ratios (no server, no timing)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.report import report, table


def _row(param: str, median: float | None, **info: Any) -> dict[str, Any]:
    return {
        "group": "g",
        "name": f"bench_x[{param}]",
        "param": param,
        "stats": None if median is None else {"median": median},
        "extra_info": info,
    }


def test_rows_print_beside_the_baseline_with_speed_and_figure_ratios() -> None:
    rows = [
        _row("lbs", 0.5, redis_cpu_us_per_message=30.0, messages=100, count=1000, per="message"),
        _row("plain", 1.0, redis_cpu_us_per_message=10.0, baseline=True, count=1000, per="message"),
    ]
    out = table("g", rows, commands=False)
    lines = out.splitlines()
    assert lines[0] == "### g"
    assert "redis_cpu_us_per_message" in lines[2] and "messages/s" in lines[2]
    assert "messages |" not in lines[2]  # a count, not a figure
    lbs, plain = lines[4], lines[5]
    assert "500 ms (2.00x)" in lbs and "30 (3.00x)" in lbs and "2,000 (2.00x)" in lbs
    assert plain.startswith("| **plain** (baseline) | 1 s |") and "(" not in plain.split("|", 2)[2]


def test_a_fixed_duration_row_prints_its_time_without_speed() -> None:
    rows = [
        _row("lbs", 10.0, p50_ms=2.0, fixed_duration=True),
        _row("plain", 5.0, p50_ms=1.0, baseline=True),
    ]
    assert "| lbs | 10 s | 2 (2.00x) |" in table("g", rows)


def test_a_group_without_baseline_prints_no_ratios_and_two_baselines_are_an_error() -> None:
    out = table("g", [_row("a", 1.0, p50_ms=2.0), _row("b", None, p50_ms=4.0)])
    assert "x)" not in out and "| b | - | 4 |" in out
    with pytest.raises(ValueError, match="2 baselines"):
        table("g", [_row("a", 1.0, baseline=True), _row("b", 1.0, baseline=True)])


def test_commands_and_versions() -> None:
    data = {
        "datetime": "2026-11-25",
        "machine_info": {"lbs": {"lbs": "0.1.0"}},
        "benchmarks": [_row("a", 1.0, commands_per_message={"evalsha": [0.5, 12.0]})],
    }
    out = report(data, commands=True)
    assert out.startswith("Measured 2026-11-25 (lbs 0.1.0)")
    assert "a, per_message: evalsha 0.5 calls 12 µs" in out


def test_a_row_is_named_by_its_label_and_consumers_is_no_figure() -> None:
    rows = [
        _row("lbs-2x", 1.0, label="lbs run() defaults", consumers=2, backlog=0, p50_ms=2.0),
        _row(
            "plain-2x", 1.0, label="plain loop", consumers=2, backlog=0, p50_ms=1.0, baseline=True
        ),
    ]
    out = table("g", rows).splitlines()
    assert "consumers" not in out[2] and "label" not in out[2] and "backlog" in out[2]
    assert out[4].startswith("| lbs run() defaults |") and "2 (2.00x)" in out[4]
    assert out[5].startswith("| **plain loop** (baseline) |")
