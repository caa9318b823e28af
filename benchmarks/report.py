"""Markdown tables from a ``--benchmark-json`` file: every row beside its group's baseline, with the ratio.

    pytest benchmarks --benchmark-disable-gc --benchmark-json=bench.json
    python -m benchmarks.report bench.json [--commands]

One table per benchmark group, in the file's order. The **baseline** of a
group is the row whose benchmark set ``extra_info["baseline"] = True`` (the
plain redis-py way of doing the same work; at most one per group: a second
one is an error). A row is named by its ``extra_info["label"]`` where it set one, else by its
pytest parameters. Columns:

* ``median``: the median time of the rounds, and beside it the **speed** against
  the baseline (baseline median / row median: 2.0x is twice as fast), except
  where the benchmark runs for a set time (``extra_info["fixed_duration"]``:
  steady rates, idle fleets, latency), whose time is no figure;
* every number the group's rows put in ``extra_info`` (Redis CPU per message,
  per assignment or per client-second, p50/p99 latency, messages/s...), and
  beside it the row's value / the baseline's (Redis CPU 1.2x = 20 % more than
  the baseline); counts that are not figures (``messages``, ``clients``,
  ``window_s``) and lists are left out;
* ``<per>s/s`` for drain benchmarks (``Bench.drain`` records ``count`` and
  ``per``): count / median, beside its ratio to the baseline's.

A group without a baseline prints its figures without ratios. ``--commands``
adds, per row, the INFO commandstats figures a benchmark recorded
(``extra_info["commands_per_..."]``: calls and µs per unit, costliest first).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

#: extra_info numbers that describe the run rather than measure it (or measure what is subtracted).
NOT_FIGURES = frozenset(
    {
        "baseline",
        "messages",
        "clients",
        "consumers",
        "window_s",
        "count",
        "rows",
        "redis_alone_cpu_us_per_s",
    }
)


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def _number(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return ""
    return f" ({value / base:.2f}x)"


def _label(bench: dict[str, Any]) -> str:
    return str(bench.get("extra_info", {}).get("label") or bench.get("param") or bench["name"])


def _figures(bench: dict[str, Any]) -> dict[str, float]:
    info: dict[str, Any] = bench.get("extra_info", {})
    out = {
        k: float(v)
        for k, v in info.items()
        if k not in NOT_FIGURES and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    median = _median(bench)
    if "count" in info and "per" in info and median:
        out[f"{info['per']}s/s"] = info["count"] / median
    return out


def _median(bench: dict[str, Any]) -> float | None:
    stats = bench.get("stats") or {}
    median = stats.get("median")
    return float(median) if median is not None else None


def groups(benchmarks: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for b in benchmarks:
        out.setdefault(str(b.get("group") or b["name"]), []).append(b)
    return out


def baseline(group: str, rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    marked = [b for b in rows if b.get("extra_info", {}).get("baseline") is True]
    if len(marked) > 1:
        raise ValueError(
            f"group {group!r} has {len(marked)} baselines: {[_label(b) for b in marked]}"
        )
    return marked[0] if marked else None


def table(group: str, rows: Sequence[dict[str, Any]], commands: bool = False) -> str:
    """One group's markdown table (and, with ``commands``, its commandstats lines)."""
    base = baseline(group, rows)
    figures = [_figures(b) for b in rows]
    columns: list[str] = []
    for f in figures:
        columns.extend(k for k in f if k not in columns)
    base_median = _median(base) if base else None
    base_figures = _figures(base) if base else {}
    head = ["benchmark", "median (speed vs baseline)", *columns]
    lines = [f"### {group}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for b, f in zip(rows, figures):
        is_base = b is base
        label = f"**{_label(b)}** (baseline)" if is_base else _label(b)
        median = _median(b)
        cells = [label]
        if median is None:
            cells.append("-")
        else:
            fixed = b.get("extra_info", {}).get("fixed_duration") is True
            no_speed = is_base or fixed or not base_median
            speed = "" if no_speed else f" ({base_median / median:.2f}x)"
            cells.append(_time(median) + speed)
        for col in columns:
            if col not in f:
                cells.append("-")
            else:
                ratio = "" if is_base else _ratio(f[col], base_figures.get(col))
                cells.append(_number(f[col]) + ratio)
        lines.append("| " + " | ".join(cells) + " |")
    if commands:
        for b in rows:
            for key, per in b.get("extra_info", {}).items():
                if key.startswith("commands_per") and isinstance(per, dict):
                    shown = ", ".join(f"{cmd} {c:g} calls {u:g} µs" for cmd, (c, u) in per.items())
                    lines.append(f"\n{_label(b)}, {key.removeprefix('commands_')}: {shown}")
    return "\n".join(lines)


def report(data: dict[str, Any], commands: bool = False) -> str:
    machine = data.get("machine_info", {})
    versions = machine.get("lbs", {})
    head = ", ".join(f"{k} {v}" for k, v in versions.items())
    parts = [f"Measured {data.get('datetime', '?')}" + (f" ({head})" if head else "")]
    parts.extend(table(g, rows, commands) for g, rows in groups(data["benchmarks"]).items())
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("json", help="a pytest-benchmark --benchmark-json file")
    parser.add_argument(
        "--commands", action="store_true", help="also print INFO commandstats per row"
    )
    args = parser.parse_args(argv)
    with open(args.json, encoding="utf-8") as f:
        data = json.load(f)
    sys.stdout.write(report(data, args.commands))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
