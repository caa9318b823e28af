"""The lbs_metric mapping and the plugin's guards, without Redis."""

from __future__ import annotations

import logging
import socket

import pytest
from prometheus_client import CollectorRegistry

import lbs
import lbs_prometheus
from lbs.plugins import make_plugin_manager
from lbs_prometheus import PrometheusPlugin

LBL = {"service": "svc", "consumer": "c1"}


class FakeClient:
    """What the hooks read of a client: service, id, held, pm."""

    def __init__(self, *plugins: object) -> None:
        self.service, self.id, self.held = "svc", "c1", 0
        self.pm = make_plugin_manager(plugins, load_entrypoints=False)


def test_lbs_metric_maps_each_kind_onto_a_family_named_lbs_name() -> None:
    reg = CollectorRegistry()
    plugin = PrometheusPlugin(registry=reg)
    client = FakeClient(plugin)
    hook = client.pm.hook.lbs_metric
    hook(client=client, name="recovery_scan_requeued_total", kind="counter", value=2, labels=LBL)
    hook(client=client, name="recovery_scan_requeued_total", kind="counter", value=3, labels=LBL)
    hook(client=client, name="recovery_dlq_total", kind="counter", value=1, labels={**LBL, "path": "scan"})
    hook(client=client, name="pel_depth", kind="gauge", value=7, labels=LBL)
    hook(client=client, name="pel_depth", kind="gauge", value=4, labels=LBL)
    hook(client=client, name="recovery_scan_duration_seconds", kind="histogram", value=0.25, labels=LBL)
    hook(client=client, name="recovery_scan_duration_seconds", kind="histogram", value=0.5, labels=LBL)

    assert reg.get_sample_value("lbs_recovery_scan_requeued_total", LBL) == 5
    assert reg.get_sample_value("lbs_recovery_dlq_total", {**LBL, "path": "scan"}) == 1
    assert reg.get_sample_value("lbs_pel_depth", LBL) == 4
    assert reg.get_sample_value("lbs_recovery_scan_duration_seconds_count", LBL) == 2
    assert reg.get_sample_value("lbs_recovery_scan_duration_seconds_sum", LBL) == 0.75
    assert reg.get_sample_value("lbs_recovery_scan_duration_seconds_bucket", {**LBL, "le": "0.25"}) == 1
    # A counter named without _total gets it once, from prometheus_client.
    hook(client=client, name="widgets", kind="counter", value=1, labels=LBL)
    assert reg.get_sample_value("lbs_widgets_total", LBL) == 1
    assert reg.get_sample_value("lbs_recovery_scan_requeued_total_total", LBL) is None


def test_misfit_events_are_logged_once_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    reg = CollectorRegistry()
    plugin = PrometheusPlugin(registry=reg)
    with caplog.at_level(logging.WARNING, logger="lbs_prometheus"):
        plugin.record("odd", "summary", 1, LBL)  # unknown kind
        plugin.record("odd", "summary", 1, LBL)
        plugin.record("pel_depth", "gauge", 3, LBL)
        plugin.record("pel_depth", "counter", 1, LBL)  # kind changed
        plugin.record("bad name!", "counter", 1, LBL)
        plugin.record("locks_acquired_total", "counter", 1, LBL)  # one of the plugin's own families
        plugin.record("pel_depth", "gauge", 5, {"service": "svc"})  # label missing: recorded as ""
        plugin.record("recovery_dlq_total", "counter", -1, LBL)  # Counter refuses: swallowed by the hook
    assert reg.get_sample_value("lbs_pel_depth", LBL) == 3
    assert reg.get_sample_value("lbs_pel_depth", {"service": "svc", "consumer": ""}) == 5
    assert reg.get_sample_value("lbs_odd_total", LBL) is None
    assert len([r for r in caplog.records if "summary" in r.getMessage()]) == 1

    client = FakeClient(plugin)
    client.pm.hook.lbs_metric(client=client, name="x_total", kind="counter", value=-1, labels=LBL)  # no raise


def test_table_names_take_kind_labels_and_help_from_lbs_metrics() -> None:
    from lbs.metrics import METRICS

    reg = CollectorRegistry()
    plugin = PrometheusPlugin(registry=reg)
    plugin.record("pel_depth", "counter", 1, LBL)  # the table says gauge: refused, and no counter family made
    plugin.record("pel_depth", "gauge", 6, LBL)
    plugin.record("recovery_dlq_total", "counter", 1, LBL)  # path missing: recorded on the table's labels
    plugin.record("widgets_total", "counter", 2, {**LBL, "colour": "red"})  # not in the table: any labels
    families = {f.name: f for f in reg.collect()}
    assert families["lbs_pel_depth"].type == "gauge"
    assert families["lbs_pel_depth"].documentation == METRICS["pel_depth"].help
    assert reg.get_sample_value("lbs_pel_depth", LBL) == 6
    assert families["lbs_recovery_dlq"].documentation == METRICS["recovery_dlq_total"].help
    assert reg.get_sample_value("lbs_recovery_dlq_total", {**LBL, "path": ""}) == 1
    assert reg.get_sample_value("lbs_widgets_total", {**LBL, "colour": "red"}) == 2
    assert "widgets_total" in families["lbs_widgets"].documentation


def test_fixed_hooks_count_and_read_the_held_gauge() -> None:
    reg = CollectorRegistry()
    plugin = PrometheusPlugin(registry=reg)
    client = FakeClient(plugin)
    hook = client.pm.hook
    client.held = 2
    hook.lbs_lock_acquired(client=client, stream="s", entry_id="1-0", token=1)
    hook.lbs_lock_acquired(client=client, stream="t", entry_id="2-0", token=2)
    assert reg.get_sample_value("lbs_held_streams", LBL) == 2
    client.held = 1
    hook.lbs_lock_released(client=client, stream="s", entry_id="1-0", token=1, status=lbs.DoneStatus.LOCK_EXPIRED)
    client.held = 0
    hook.lbs_stream_disowned(client=client, stream="t", entry_id="2-0", token=2)
    hook.lbs_locks_extended(client=client, extended=5, lost=1, seconds=0.01)
    hook.lbs_stream_dead_lettered(client=client, entry_id="3-0", reason="bad", dead_letter_id="")
    assert reg.get_sample_value("lbs_locks_acquired_total", LBL) == 2
    assert reg.get_sample_value("lbs_locks_released_total", {**LBL, "status": "LOCK_EXPIRED"}) == 1
    assert reg.get_sample_value("lbs_streams_disowned_total", LBL) == 1
    assert reg.get_sample_value("lbs_heartbeat_locks_extended_total", LBL) == 5
    assert reg.get_sample_value("lbs_heartbeat_locks_lost_total", LBL) == 1
    assert reg.get_sample_value("lbs_streams_dead_lettered_total", LBL) == 1
    assert reg.get_sample_value("lbs_held_streams", LBL) == 0


def test_an_explicit_plugin_replaces_the_auto_loaded_one_for_its_client() -> None:
    reg = CollectorRegistry()
    explicit = PrometheusPlugin(registry=reg)
    default = lbs_prometheus.default_plugin
    both = FakeClient(explicit, default)
    both.id = "c-explicit"
    both.pm.hook.lbs_lock_acquired(client=both, stream="s", entry_id="1-0", token=1)
    assert reg.get_sample_value("lbs_locks_acquired_total", {"service": "svc", "consumer": "c-explicit"}) == 1
    assert default.registry.get_sample_value("lbs_locks_acquired_total",
                                             {"service": "svc", "consumer": "c-explicit"}) is None


def test_two_plugins_on_one_registry_share_its_families() -> None:
    reg = CollectorRegistry()
    a, b = PrometheusPlugin(registry=reg), PrometheusPlugin(registry=reg)  # no "Duplicated timeseries"
    a.record("pel_depth", "gauge", 1, LBL)
    b.record("pel_depth", "gauge", 2, LBL)
    assert reg.get_sample_value("lbs_pel_depth", LBL) == 2


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

