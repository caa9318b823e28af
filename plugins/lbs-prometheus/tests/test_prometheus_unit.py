"""The collector, the hooks and the health check, without Redis: a client's own counters read at scrape time."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import socket
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import lbs
import lbs_prometheus
from lbs.metrics import METRICS
from lbs.plugins import Hooks, make_plugin_manager
from lbs_prometheus import OWN, PREFIX, PrometheusPlugin, collector_for

LBL = {"service": "svc", "consumer": "c1"}


class FakeClient:
    """What the plugin reads of a client: service, id, held, pm, config, stats and metrics (a real Hooks)."""

    def __init__(self, *plugins: object, consumer: str = "c1") -> None:
        self.service, self.id, self.held = "svc", consumer, 0
        self.pm = make_plugin_manager(plugins, load_entrypoints=False)
        self.config = lbs.Config(heartbeat_interval=1.0)
        self.stats = lbs.ClientStats()
        self.hooks = Hooks(
            self.pm, self, {"service": self.service, "consumer": self.id}, logging.getLogger("test")
        )
        self.metrics = self.hooks.counts

    def start(self) -> None:
        self.pm.hook.lbs_client_started(client=self)

    def close(self) -> None:
        self.pm.hook.lbs_client_closed(client=self, handed_back=0)


def _started(*plugins: object, consumer: str = "c1") -> FakeClient:
    client = FakeClient(*plugins, consumer=consumer)
    client.start()
    return client


def test_the_plugin_implements_no_per_stream_hook() -> None:
    client = FakeClient(PrometheusPlugin(registry=CollectorRegistry()))
    implemented = {
        name
        for name in (
            "lbs_lock_acquired",
            "lbs_stream_started",
            "lbs_lock_released",
            "lbs_streams_started",
            "lbs_locks_released",
            "lbs_stream_disowned",
            "lbs_stream_handed_back",
            "lbs_stream_dead_lettered",
            "lbs_stream_expired",
        )
        if getattr(client.pm.hook, name).get_hookimpls()
    }
    assert implemented == set()


def test_stats_are_read_when_scraped_not_when_counted() -> None:
    reg = CollectorRegistry()
    client = _started(PrometheusPlugin(registry=reg))
    st = client.stats
    st.taken, st.done, st.lock_expired, st.lock_lost = 5, 3, 1, 0
    st.handed_back, st.dead_lettered, st.handler_failures, st.handler_timeouts = 2, 1, 4, 1
    st.retries_delayed, st.heartbeats = 3, 7
    st.handler_seconds.observe(0.02)
    st.handler_seconds.observe(0.3)
    client.held = 2
    assert reg.get_sample_value("lbs_locks_acquired_total", LBL) == 5
    assert reg.get_sample_value("lbs_locks_released_total", {**LBL, "status": "DONE"}) == 3
    assert reg.get_sample_value("lbs_locks_released_total", {**LBL, "status": "LOCK_EXPIRED"}) == 1
    assert reg.get_sample_value("lbs_locks_released_total", {**LBL, "status": "LOCK_LOST"}) == 0
    assert reg.get_sample_value("lbs_streams_handed_back_total", LBL) == 2
    assert reg.get_sample_value("lbs_streams_dead_lettered_total", LBL) == 1
    assert reg.get_sample_value("lbs_handler_failures_total", LBL) == 4
    assert reg.get_sample_value("lbs_handler_timeouts_total", LBL) == 1
    assert reg.get_sample_value("lbs_retries_delayed_total", LBL) == 3
    assert reg.get_sample_value("lbs_heartbeat_ticks_total", LBL) == 7
    assert reg.get_sample_value("lbs_held_streams", LBL) == 2
    assert reg.get_sample_value("lbs_client_running", LBL) == 1
    assert reg.get_sample_value("lbs_handler_seconds_count", LBL) == 2
    assert reg.get_sample_value("lbs_handler_seconds_sum", LBL) == pytest.approx(0.32)
    assert reg.get_sample_value("lbs_handler_seconds_bucket", {**LBL, "le": "0.025"}) == 1
    assert reg.get_sample_value("lbs_handler_seconds_bucket", {**LBL, "le": "+Inf"}) == 2
    st.taken += 1  # no hook: the next scrape simply reads more
    assert reg.get_sample_value("lbs_locks_acquired_total", LBL) == 6
    client.close()
    assert reg.get_sample_value("lbs_client_running", LBL) == 0
    assert reg.get_sample_value("lbs_locks_acquired_total", LBL) == 6  # kept while the client lives


def test_heartbeat_ticks_and_reader_terminations_come_from_their_hooks() -> None:
    reg = CollectorRegistry()
    client = _started(PrometheusPlugin(registry=reg))
    hook = client.pm.hook
    hook.lbs_locks_extended(client=client, extended=5, lost=1, seconds=0.01)
    hook.lbs_locks_extended(client=client, extended=4, lost=0, seconds=0.3)
    hook.lbs_reader_terminated(client=client, error=RuntimeError("gone"))
    assert reg.get_sample_value("lbs_heartbeat_locks_extended_total", LBL) == 9
    assert reg.get_sample_value("lbs_heartbeat_locks_lost_total", LBL) == 1
    assert reg.get_sample_value("lbs_streams_disowned_total", LBL) == 1
    assert reg.get_sample_value("lbs_heartbeat_tick_seconds_count", LBL) == 2
    assert reg.get_sample_value("lbs_heartbeat_tick_seconds_bucket", {**LBL, "le": "0.01"}) == 1
    assert reg.get_sample_value("lbs_heartbeat_tick_seconds_bucket", {**LBL, "le": "0.25"}) == 1
    assert reg.get_sample_value("lbs_reader_terminations_total", LBL) == 1


def test_metric_events_are_read_from_the_client_with_their_labels() -> None:
    reg = CollectorRegistry()
    client = _started(PrometheusPlugin(registry=reg))
    m = client.hooks.metric
    m("recovery_scan_requeued_total", 2)
    m("recovery_scan_requeued_total", 3)
    m("recovery_dlq_total", 1, path="scan")
    m("recovery_dlq_total", 2, path="deadline")
    m("dead_letters_forwarded_total", 4, backend="jsonl")
    m("pel_depth", 7)
    m("pel_depth", 4)
    m("recovery_scan_duration_seconds", 0.25)
    m("recovery_scan_duration_seconds", 0.5)
    assert client.metrics.get("recovery_dlq_total") == 3  # by name, as before
    assert client.metrics.series["recovery_dlq_total"] == {("scan",): 1, ("deadline",): 2}
    assert reg.get_sample_value("lbs_recovery_scan_requeued_total", LBL) == 5
    assert reg.get_sample_value("lbs_recovery_dlq_total", {**LBL, "path": "scan"}) == 1
    assert reg.get_sample_value("lbs_recovery_dlq_total", {**LBL, "path": "deadline"}) == 2
    assert (
        reg.get_sample_value("lbs_dead_letters_forwarded_total", {**LBL, "backend": "jsonl"}) == 4
    )
    assert reg.get_sample_value("lbs_pel_depth", LBL) == 4
    assert reg.get_sample_value("lbs_recovery_scan_duration_seconds_count", LBL) == 2
    assert reg.get_sample_value("lbs_recovery_scan_duration_seconds_sum", LBL) == 0.75
    assert (
        reg.get_sample_value("lbs_recovery_scan_duration_seconds_bucket", {**LBL, "le": "0.25"})
        == 1
    )
    families = {f.name: f for f in reg.collect()}
    assert families["lbs_pel_depth"].documentation == METRICS["pel_depth"].help
    assert families["lbs_recovery_dlq"].type == "counter"


def test_the_exposition_is_valid_and_names_carry_one_total() -> None:
    reg = CollectorRegistry()
    client = _started(PrometheusPlugin(registry=reg))
    client.hooks.metric("read_failures_total", 1)
    client.stats.handler_seconds.observe(1.5)
    text = generate_latest(reg).decode()
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert "lbs_read_failures_total" in names and "lbs_locks_acquired_total" in names
    assert not any(n.endswith("_total_total") for n in names)


def test_other_plugins_names_get_families_of_their_own() -> None:
    reg = CollectorRegistry()
    plugin = PrometheusPlugin(registry=reg)
    client = FakeClient(plugin)
    hook = client.pm.hook.lbs_metric
    hook(client=client, name="widgets", kind="counter", value=1, labels=LBL)
    hook(client=client, name="widgets", kind="counter", value=2, labels=LBL)
    hook(
        client=client,
        name="queue_lag_seconds",
        kind="histogram",
        value=0.1,
        labels={**LBL, "queue": "q"},
    )
    hook(
        client=client, name="pel_depth", kind="gauge", value=9, labels=LBL
    )  # lbs's own: read from the client
    assert reg.get_sample_value("lbs_widgets_total", LBL) == 3
    assert reg.get_sample_value("lbs_queue_lag_seconds_count", {**LBL, "queue": "q"}) == 1
    assert reg.get_sample_value("lbs_pel_depth", LBL) is None
    assert "widgets" in {f.name: f for f in reg.collect()}["lbs_widgets"].documentation


def test_misfit_events_are_logged_once_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    reg = CollectorRegistry()
    plugin = PrometheusPlugin(registry=reg)
    with caplog.at_level(logging.WARNING, logger="lbs_prometheus"):
        plugin.record("odd", "summary", 1, LBL)  # unknown kind
        plugin.record("odd", "summary", 1, LBL)
        plugin.record("gadgets", "gauge", 3, LBL)
        plugin.record("gadgets", "counter", 1, LBL)  # kind changed
        plugin.record("bad name!", "counter", 1, LBL)
        plugin.record("locks_acquired_total", "counter", 1, LBL)  # one of the plugin's own families
        plugin.record("locks_acquired", "gauge", 1, LBL)  # ... under another kind
        plugin.record("pel_depth", "gauge", 1, LBL)  # lbs's own name
        plugin.record("gadgets", "gauge", 5, {"service": "svc"})  # label missing: recorded as ""
        plugin.record("things_total", "counter", -1, LBL)  # Counter refuses a decrement
    assert reg.get_sample_value("lbs_gadgets", LBL) == 3
    assert reg.get_sample_value("lbs_gadgets", {"service": "svc", "consumer": ""}) == 5
    assert reg.get_sample_value("lbs_odd_total", LBL) is None
    assert reg.get_sample_value("lbs_locks_acquired", LBL) is None
    assert len([r for r in caplog.records if "summary" in r.getMessage()]) == 1
    assert any("collides" in r.getMessage() for r in caplog.records)
    assert any("read from its clients" in r.getMessage() for r in caplog.records)

    client = FakeClient(plugin)
    client.pm.hook.lbs_metric(
        client=client, name="x_total", kind="counter", value=-1, labels=LBL
    )  # no raise


def test_family_names_are_stable_and_never_collide() -> None:
    own = {PREFIX + m.name for m in OWN}
    # The families lbs-prometheus 0.1 exported keep their names.
    assert {
        "lbs_locks_acquired_total",
        "lbs_locks_released_total",
        "lbs_streams_disowned_total",
        "lbs_streams_handed_back_total",
        "lbs_streams_dead_lettered_total",
        "lbs_heartbeat_ticks_total",
        "lbs_heartbeat_locks_extended_total",
        "lbs_heartbeat_locks_lost_total",
        "lbs_heartbeat_tick_seconds",
        "lbs_held_streams",
        "lbs_client_running",
        "lbs_reader_terminations_total",
    } <= own
    stems = [n.removesuffix("_total") for n in (*own, *(PREFIX + n for n in METRICS))]
    assert len(stems) == len(set(stems))


def test_an_explicit_plugin_replaces_the_auto_loaded_one_for_its_client() -> None:
    reg = CollectorRegistry()
    explicit = PrometheusPlugin(registry=reg)
    default = lbs_prometheus.default_plugin
    both = _started(explicit, default, consumer="c-explicit")
    both.stats.taken = 1
    labels = {"service": "svc", "consumer": "c-explicit"}
    assert reg.get_sample_value("lbs_locks_acquired_total", labels) == 1
    assert default.registry.get_sample_value("lbs_locks_acquired_total", labels) is None


def test_plugins_on_one_registry_share_its_collector_and_count_once() -> None:
    reg = CollectorRegistry()
    a, b = (
        PrometheusPlugin(registry=reg),
        PrometheusPlugin(registry=reg),
    )  # no "Duplicated timeseries"
    assert a.collector is b.collector is collector_for(reg)
    client = _started(a, b)
    client.pm.hook.lbs_locks_extended(client=client, extended=3, lost=0, seconds=0.01)
    assert reg.get_sample_value("lbs_heartbeat_locks_extended_total", LBL) == 3
    assert len([f for f in reg.collect() if f.name == "lbs_locks_acquired"]) == 1


def test_a_client_dropped_by_the_application_leaves_the_scrape() -> None:
    reg = CollectorRegistry()
    client: Any = _started(PrometheusPlugin(registry=reg), consumer="gone")
    labels = {"service": "svc", "consumer": "gone"}
    assert reg.get_sample_value("lbs_client_running", labels) == 1
    del client
    gc.collect()
    assert reg.get_sample_value("lbs_client_running", labels) is None


def test_health_judges_each_running_client_by_its_last_heartbeat() -> None:
    reg = CollectorRegistry()
    plugin = PrometheusPlugin(registry=reg)
    collector = plugin.collector
    ok, body = collector.health()
    assert not ok and body["unhealthy"] == [{"reason": "no lbs client is running"}]
    a, b = _started(plugin, consumer="a"), _started(plugin, consumer="b")
    started = max(r.started_at for _, r in collector.clients())
    ok, body = collector.health(now=started + 1.5)  # limit: 2 x heartbeat_every = 2 s
    assert ok and body["status"] == "ok"
    assert sorted(e["consumer"] for e in body["clients"]) == ["a", "b"]
    a.stats.heartbeat_at = started + 2.0
    ok, body = collector.health(now=started + 3.0)  # a beat 1 s ago; b never, started 3 s ago
    assert not ok
    assert [(u["consumer"], u["reason"]) for u in body["unhealthy"]] == [
        ("b", "no heartbeat for 3.0s (limit 2s)")
    ]
    b.close()  # a closed client is listed, not judged
    ok, body = collector.health(now=started + 3.0)
    assert ok and {e["consumer"]: e["state"] for e in body["clients"]} == {
        "a": "running",
        "b": "closed",
    }
    a.pm.hook.lbs_reader_terminated(client=a, error=RuntimeError("gone"))
    ok, body = collector.health(now=started + 3.0)
    assert not ok and body["unhealthy"] == [
        {"service": "svc", "consumer": "a", "reason": "its reader gave up"}
    ]


class _LoopThread:
    """An event loop running in a thread of its own (as the blocking facade's does)."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def start(self, plugin: PrometheusPlugin, consumer: str) -> FakeClient:
        """A client whose ``lbs_client_started`` runs on this loop."""

        async def start() -> FakeClient:
            return _started(plugin, consumer=consumer)

        return asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def test_liveness_runs_a_no_op_on_each_client_s_loop_and_ignores_heartbeats() -> None:
    collector = PrometheusPlugin(registry=CollectorRegistry()).collector
    ok, body = collector.liveness(1.0)
    assert ok and body == {"status": "ok", "clients": []}  # the process answered: alive
    plugin = PrometheusPlugin(registry=CollectorRegistry())
    collector = plugin.collector
    running = _LoopThread("client-loop")
    try:
        a = running.start(plugin, "a")
        _started(plugin, consumer="b")  # started off any loop: nothing to probe
        started = max(r.started_at for _, r in collector.clients())
        # No heartbeat for a minute (Redis down): not ready, still alive.
        assert not collector.readiness(now=started + 60)[0]
        ok, body = collector.liveness(10.0)
        assert ok, body
        by_name = {c["consumer"]: c for c in body["clients"]}
        assert by_name["a"]["loop_lag"] >= 0 and "loop_lag" not in by_name["b"]
        # A reader that gave up reads again only after a restart: dead.
        a.pm.hook.lbs_reader_terminated(client=a, error=RuntimeError("gone"))
        ok, body = collector.liveness(10.0)
        assert not ok and [u["consumer"] for u in body["unhealthy"]] == ["a"]
        assert body["unhealthy"][0]["reason"].startswith("its reader gave up")
    finally:
        running.stop()
        running.loop.close()


def test_liveness_names_a_stopped_or_closed_loop_under_a_running_client() -> None:
    plugin = PrometheusPlugin(registry=CollectorRegistry())
    stopped = _LoopThread("unit-loop")
    client = stopped.start(plugin, "c")
    stopped.stop()  # the loop no longer runs; the client was never closed
    ok, body = plugin.collector.liveness(0.05)
    (dead,) = body["unhealthy"]
    assert not ok and dead["consumer"] == client.id and dead["thread"] == "unit-loop"
    assert dead["reason"] == (
        "its event loop did not run a callback within 0.05s (blocked, or stopped)"
    )
    stopped.loop.close()  # closed: said so without waiting
    ok, body = plugin.collector.liveness(30.0)
    (dead,) = body["unhealthy"]
    assert not ok and dead["reason"] == "its event loop is closed (client not closed)"
    client.close()  # closed clients are listed, not judged
    ok, body = plugin.collector.liveness(30.0)
    assert ok and body["clients"] == [{"service": "svc", "consumer": "c", "state": "closed"}]


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "2", True])
def test_a_live_timeout_that_is_no_positive_number_is_a_configuration_error(bad: Any) -> None:
    with pytest.raises(lbs.ConfigurationError, match="live_timeout"):
        PrometheusPlugin(registry=CollectorRegistry(), live_timeout=bad)
    with pytest.raises(lbs.ConfigurationError, match="live_timeout"):
        lbs_prometheus.make_app(CollectorRegistry(), live_timeout=bad)


def test_the_live_timeout_variable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from lbs_prometheus._plugin import env_live_timeout

    monkeypatch.delenv(lbs_prometheus.LIVE_TIMEOUT_ENV, raising=False)
    assert env_live_timeout() == lbs_prometheus.LIVE_TIMEOUT
    monkeypatch.setenv(lbs_prometheus.LIVE_TIMEOUT_ENV, "0.5")
    assert env_live_timeout() == 0.5
    for bad in ("soon", "0", "-1", "inf", "nan"):
        monkeypatch.setenv(lbs_prometheus.LIVE_TIMEOUT_ENV, bad)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="lbs_prometheus"):
            assert env_live_timeout() == lbs_prometheus.LIVE_TIMEOUT
        assert any(lbs_prometheus.LIVE_TIMEOUT_ENV in r.getMessage() for r in caplog.records)


def test_a_port_in_use_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="lbs_prometheus"):
            plugin = PrometheusPlugin(port=port, registry=CollectorRegistry())
        assert plugin.port is None
        assert any("cannot serve" in r.getMessage() for r in caplog.records)
        plugin.close()
