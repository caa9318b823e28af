"""The plugin as installed: auto-loaded through the entry point, inert unless LBS_PROMETHEUS_PORT is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from _prom_helpers import get, scrape, value

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHILD = Path(__file__).with_name("_prom_child.py")


@contextmanager
def _child(url: str, service: str, **env: str) -> Iterator[dict[str, Any]]:
    """Run _prom_child.py; yield its report while it still runs; then let it close and exit."""
    child_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LBS_LOAD_PLUGINS", "LBS_PROMETHEUS_PORT", "LBS_PROMETHEUS_ADDR")
    }
    child_env.update(env)
    with subprocess.Popen(
        [sys.executable, str(CHILD), url, service],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, f"child exited with {proc.wait(10)} before reporting"
            yield json.loads(line)
            proc.communicate("\n", timeout=20)
            assert proc.returncode == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_installed_plugin_records_but_binds_nothing_without_the_port_variable(
    redis_server: Any, service: str
) -> None:
    with _child(redis_server.url, service) as report:
        assert report["loaded"], (
            "the entry point 'prometheus' must be loaded into a default lbs.Client"
        )
        assert report["port"] is None
        assert report["listening"] == [], (
            f"the plugin must not listen anywhere: {report['listening']}"
        )
        # It still records into prometheus_client's default REGISTRY.
        assert report["acquired"] == 1
        assert report["released"] == 1


def test_port_variable_makes_the_installed_plugin_serve(redis_server: Any, service: str) -> None:
    with _child(redis_server.url, service, LBS_PROMETHEUS_PORT="0") as report:
        assert report["loaded"]
        port = report["port"]
        assert isinstance(port, int) and port > 0
        assert report["listening"] == [port]
        samples = scrape(port)
        lbl = {"service": service, "consumer": report["consumer"]}
        assert value(samples, "lbs_locks_acquired_total", **lbl) == 1
        assert value(samples, "lbs_locks_released_total", **lbl, status="DONE") == 1
        assert value(samples, "lbs_held_streams", **lbl) == 0
        status, body = get(port, "/healthz")
        assert status == 200, body
        clients = json.loads(body)["clients"]
        assert [(c["service"], c["consumer"], c["state"]) for c in clients] == [
            (service, lbl["consumer"], "running")
        ]
