"""``lbs.metrics.METRICS`` is the one table of metric names, true to what src/lbs emits.

The names are found in the source with ``ast``, whatever the emitting call
looks like: ``hooks.metric("name", value, **labels)``,
``recovery._metric("name", "kind", value, **labels)``, a name kept in a dict
or a constant, or an f-string such as ``f"recovery_{path}_requeued_total"``
(which stands for every table name it matches).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import math
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from lbs import hookspecs
from lbs.metrics import BASE_LABELS, KINDS, METRICS, Metric, render_markdown, render_rst
from lbs.plugins import Hooks, MetricValues, make_plugin_manager

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "lbs"
GUIDE = ROOT / "docs" / "PLUGINS.md"

#: A string literal ending so, and shaped like a name, is taken for a metric name.
SUFFIXES = ("_total", "_seconds", "_success", "_depth", "_overdue")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
#: lbs-prometheus's prefix: literals with it (the demo reads its families back) are
#: Prometheus family names, not lbs_metric names; no table name starts with it.
PROM_PREFIX = "lbs_"
#: The calls that emit: the new ``metric(name, value, **labels)`` and the old
#: ``_metric(name, kind, value, **labels)``.
EMITTERS = ("metric", "_metric")


@dataclasses.dataclass
class Emission:
    """One emitting call whose name is a literal (or an f-string pattern)."""

    name: str  # a name, or a regular expression when ``pattern``
    pattern: bool
    kind: str | None  # the old form's literal kind
    labels: frozenset[str] | None  # keyword arguments; None when ``**labels`` is passed on
    where: str


@dataclasses.dataclass
class Scan:
    literals: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # name -> where
    patterns: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # regex -> where
    calls: list[Emission] = dataclasses.field(default_factory=list)


def _looks_like_metric(text: str) -> bool:
    return (
        bool(_NAME.match(text))
        and not text.startswith(PROM_PREFIX)
        and (text.endswith(SUFFIXES) or text in METRICS)
    )


def _pattern(node: ast.JoinedStr) -> str | None:
    """``f"recovery_{path}_requeued_total"`` -> ``recovery_[a-z0-9_]+_requeued_total``, if metric-shaped."""
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if not re.fullmatch(r"[a-z0-9_]*", value.value):
                return None
            parts.append(re.escape(value.value))
        else:
            parts.append("[a-z0-9_]+")
    last = node.values[-1] if node.values else None
    if not (
        isinstance(last, ast.Constant)
        and isinstance(last.value, str)
        and last.value.endswith(SUFFIXES)
    ):
        return None
    return "".join(parts)


def scan_source(source: str, filename: str, into: Scan | None = None) -> Scan:
    """Every metric-shaped literal, f-string pattern and emitting call in one module."""
    scan = Scan() if into is None else into
    tree = ast.parse(source, filename)
    in_fstrings = {
        id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values
    }
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in in_fstrings
        ):
            if _looks_like_metric(node.value):
                scan.literals.setdefault(node.value, []).append(where)
        elif isinstance(node, ast.JoinedStr):
            regex = _pattern(node)
            if regex is not None:
                scan.patterns.setdefault(regex, []).append(where)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if called not in EMITTERS:
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                name, pattern = first.value, False
            elif isinstance(first, ast.JoinedStr) and (regex := _pattern(first)) is not None:
                name, pattern = regex, True
            else:
                continue  # a name computed elsewhere: its literal is collected where it is written
            second = node.args[1] if len(node.args) > 1 else None
            kind = (
                second.value if isinstance(second, ast.Constant) and second.value in KINDS else None
            )
            labels = (
                None
                if any(k.arg is None for k in node.keywords)
                else frozenset(k.arg for k in node.keywords if k.arg is not None)
            )
            scan.calls.append(Emission(name, pattern, kind, labels, where))
    return scan


def _sources() -> Iterable[Path]:
    return (p for p in sorted(SRC.rglob("*.py")) if p != SRC / "metrics.py")


@pytest.fixture(scope="module")
def emitted() -> Scan:
    scan = Scan()
    for path in _sources():
        scan_source(path.read_text(), str(path.relative_to(ROOT)), scan)
    return scan


def _matching(regex: str) -> list[str]:
    return [name for name in METRICS if re.fullmatch(regex, name)]


# ------------------------------------------------------------------ the table ---


def test_every_metric_has_a_valid_kind_and_a_help_sentence() -> None:
    assert METRICS
    for name, m in METRICS.items():
        assert isinstance(m, Metric) and m.name == name
        assert m.kind in KINDS, name
        assert m.help.strip() == m.help and m.help.endswith("."), f"{name}: help is one sentence"
        assert m.help[0].isupper() or m.help[0].isdigit(), name
        assert not set(m.labels) & set(BASE_LABELS), name
        assert _NAME.match(name) and not name.startswith(PROM_PREFIX), name
        if m.kind == "counter":
            assert name.endswith("_total"), f"{name}: a counter's name ends in _total"


def test_the_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        METRICS["x_total"] = Metric("x_total", "counter", "X.")  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        METRICS["pel_depth"].help = "changed"  # type: ignore[misc]
    with pytest.raises(ValueError, match="kind"):
        Metric("x_total", "summary", "X.")  # type: ignore[arg-type]


# ------------------------------------------------------ the table == src/lbs ---


def test_the_scanner_sees_every_form_of_emission() -> None:
    source = """
hooks.metric("read_failures_total", 1)
self.recovery._metric("recovery_dlq_total", "counter", 1, path=path)
self._metric(f"recovery_{path}_requeued_total", "counter", 1)
REQUEUED = {"scan": "recovery_scan_requeued_total"}
log.info(f"took {n}s", "not a metric", "lbs_locks_acquired_total", "_requeued_total")
"""
    scan = scan_source(source, "example.py")
    assert set(scan.literals) == {
        "read_failures_total",
        "recovery_dlq_total",
        "recovery_scan_requeued_total",
    }
    assert list(scan.patterns) == [r"recovery_[a-z0-9_]+_requeued_total"]
    calls = {(c.name, c.pattern, c.kind, c.labels) for c in scan.calls}
    assert calls == {
        ("read_failures_total", False, None, frozenset()),
        ("recovery_dlq_total", False, "counter", frozenset({"path"})),
        (r"recovery_[a-z0-9_]+_requeued_total", True, "counter", frozenset()),
    }


def test_every_name_emitted_is_in_the_table(emitted: Scan) -> None:
    unknown = {name: where for name, where in emitted.literals.items() if name not in METRICS}
    assert not unknown, f"emitted but not in lbs.metrics.METRICS (add them there): {unknown}"
    unmatched = {regex: where for regex, where in emitted.patterns.items() if not _matching(regex)}
    assert not unmatched, f"f-string names matching nothing in lbs.metrics.METRICS: {unmatched}"


def test_every_table_entry_is_emitted_somewhere(emitted: Scan) -> None:
    found = set(emitted.literals)
    for regex in emitted.patterns:
        found.update(_matching(regex))
    unused = sorted(set(METRICS) - found)
    assert not unused, f"in lbs.metrics.METRICS but emitted nowhere in src/lbs: {unused}"


def test_emitting_calls_agree_with_the_table(emitted: Scan) -> None:
    assert emitted.calls, "no metric(...)/_metric(...) call with a literal name found in src/lbs"
    for call in emitted.calls:
        for name in _matching(call.name) if call.pattern else [call.name]:
            m = METRICS.get(name)
            if m is None:
                continue  # reported by test_every_name_emitted_is_in_the_table
            if call.kind is not None:
                assert call.kind == m.kind, (
                    f"{call.where}: {name} emitted as a {call.kind}, the table says {m.kind}"
                )
            if call.labels is not None:
                assert call.labels == set(m.labels), (
                    f"{call.where}: {name} emitted with labels {sorted(call.labels)}, the table says {list(m.labels)}"
                )


# ------------------------------------------------------------- the docs ---


def test_the_hookspec_docstring_lists_every_metric() -> None:
    doc = inspect.getdoc(hookspecs.lbs_metric) or ""
    assert "<lbs.metrics.METRICS>" not in doc, (
        "the table was not filled into lbs_metric's docstring"
    )
    for m in METRICS.values():
        assert f"``{m.name}`` ({m.kind}" in doc, m.name
        assert m.help in doc, m.name
    assert inspect.cleandoc(render_rst()) in doc
    assert doc.rstrip().endswith(".. versionadded:: 0.1")


def test_the_plugin_guide_shows_the_table_as_rendered() -> None:
    guide = GUIDE.read_text()
    found = re.search(
        r"<!-- begin: lbs\.metrics\.render_markdown\(\) -->\n(.*?)"
        r"<!-- end: lbs\.metrics\.render_markdown\(\) -->",
        guide,
        re.S,
    )
    assert found, "docs/PLUGINS.md has no block rendered by lbs.metrics.render_markdown()"
    assert found.group(1) == render_markdown(), (
        "docs/PLUGINS.md's metric table differs from lbs.metrics.METRICS: paste in "
        '`python -c "import lbs.metrics as m; print(m.render_markdown())"`'
    )


# ------------------------------------------------------- Hooks keeps them ---


def _hooks() -> Hooks:
    pm = make_plugin_manager([], load_entrypoints=False)
    return Hooks(pm, object(), {"service": "svc", "consumer": "c1"}, logging.getLogger("test"))


def test_hooks_keep_each_metric_by_name_and_by_labels() -> None:
    hooks = _hooks()
    hooks.metric("recovery_dlq_total", 1, path="scan")
    hooks.metric("recovery_dlq_total", 2, path="deadline")
    hooks.metric("recovery_dlq_total", 3, path="scan")
    hooks.metric("pel_depth", 5)
    hooks.metric("pel_depth", 2)
    hooks.metric("recovery_scan_duration_seconds", 0.2)
    hooks.metric("recovery_scan_duration_seconds", 3.0)
    values = hooks.counts
    assert isinstance(values, MetricValues) and isinstance(values, dict)
    # By name, as Client.metrics always gave them: counters summed, the rest the last value.
    assert dict(values) == {
        "recovery_dlq_total": 6,
        "pel_depth": 2,
        "recovery_scan_duration_seconds": 3.0,
    }
    # By labels, in the table's label order, with histograms kept whole.
    assert values.series["recovery_dlq_total"] == {("scan",): 4, ("deadline",): 2}
    assert values.series["pel_depth"] == {(): 2}
    (histogram,) = values.series["recovery_scan_duration_seconds"].values()
    assert not isinstance(histogram, (int, float))
    assert histogram.cumulative()[-1] == (math.inf, 2) and histogram.sum == 3.2
    assert hooks.series is values.series


def test_hooks_tell_lbs_metric_only_when_someone_listens() -> None:
    heard: list[tuple[str, str, float, dict[str, str]]] = []

    class Listener:
        @hookspecs.hookimpl
        def lbs_metric(self, name: str, kind: str, value: float, labels: dict[str, str]) -> None:
            heard.append((name, kind, value, dict(labels)))

    pm = make_plugin_manager([Listener()], load_entrypoints=False)
    hooks = Hooks(pm, object(), {"service": "svc", "consumer": "c1"}, logging.getLogger("test"))
    hooks.metric("dead_letters_forwarded_total", 2, backend="jsonl")
    assert heard == [
        (
            "dead_letters_forwarded_total",
            "counter",
            2,
            {"service": "svc", "consumer": "c1", "backend": "jsonl"},
        )
    ]


# ----------------------------------------------------------- lbs-prometheus ---


def test_lbs_prometheus_describes_each_metric_with_the_table() -> None:
    pytest.importorskip("prometheus_client")
    lbs_prometheus = pytest.importorskip("lbs_prometheus")
    from prometheus_client import CollectorRegistry

    import lbs

    registry = CollectorRegistry()
    plugin = lbs_prometheus.PrometheusPlugin(registry=registry)

    class Client:
        """What the plugin reads of a client."""

        def __init__(self) -> None:
            self.service, self.id, self.held = "svc", "c1", 0
            self.config, self.stats = lbs.Config(), lbs.ClientStats()
            self.pm = make_plugin_manager([plugin], load_entrypoints=False)
            self.hooks = Hooks(
                self.pm, self, {"service": "svc", "consumer": "c1"}, logging.getLogger("test")
            )
            self.metrics = self.hooks.counts

    client = Client()
    client.pm.hook.lbs_client_started(client=client)
    for m in METRICS.values():
        client.hooks.metric(m.name, 1.0, **dict.fromkeys(m.labels, "x"))
    families = {f.name: f for f in registry.collect()}
    for m in METRICS.values():
        family_name = lbs_prometheus.PREFIX + m.name.removesuffix(
            "_total" if m.kind == "counter" else ""
        )
        family = families.get(family_name)
        assert family is not None, f"lbs-prometheus made no family {family_name} for {m.name}"
        assert family.documentation == m.help, m.name
        assert family.type == m.kind, m.name
        sample_labels = {k for s in family.samples for k in s.labels if k != "le"}
        assert sample_labels == {*BASE_LABELS, *m.labels}, m.name
