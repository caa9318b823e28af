"""``lbs worker --processes N`` with the installed plugin: every worker process serves /metrics,
/livez, /readyz and /healthz, on LBS_PROMETHEUS_PORT + its slot, and the banner says where."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _prom_helpers import get, scrape, value

import lbs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HERE = Path(__file__).parent


def _free_pair() -> int:
    """A port p with p + 1 free too (both bound once, then released)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            try:
                with socket.socket() as b:
                    b.bind(("127.0.0.1", p + 1))
                    return int(p)
            except OSError:
                continue
    raise RuntimeError("no two consecutive free ports")


def _until(check: Any, what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
            if got:
                return got
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.2)


def test_every_worker_process_serves_metrics_and_health_on_its_own_port(
    redis_server: Any, service: str, tmp_path: Path
) -> None:
    base = _free_pair()
    env = {
        k: v for k, v in os.environ.items() if k not in ("LBS_LOAD_PLUGINS", "LBS_PROMETHEUS_ADDR")
    }
    env.update(
        LBS_PROMETHEUS_PORT=str(base),
        PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
    )
    err = tmp_path / "err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lbs",
                "worker",
                "_prom_handlers:ok",
                "--service",
                service,
                "--url",
                redis_server.url,
                "--consumer-id",
                "pw",
                "--processes",
                "2",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
        )
    try:
        for slot in (0, 1):
            port = base + slot
            labels = {"service": service, "consumer": f"redis-consumer-pw-{slot}"}
            _until(
                lambda port=port, labels=labels: (
                    value(scrape(port), "lbs_held_streams", **labels) is not None
                ),
                f"worker {slot}'s client on :{port}/metrics",
            )
            for path in ("/readyz", "/healthz", "/livez"):
                _status, body = _until(
                    lambda port=port, path=path: (lambda r: r if r[0] == 200 else None)(
                        get(port, path)
                    ),
                    f"worker {slot} healthy on :{port}{path}",
                )
                clients = json.loads(body)["clients"]
                assert [c["consumer"] for c in clients] == [labels["consumer"]], body
        text = _until(
            lambda: "one port per worker process" in err.read_text() and err.read_text(),
            "the banner",
        )
        flat = " ".join(text.replace("│", " ").split())  # the banner's row may wrap in its box
        assert (
            f"http://127.0.0.1:{base}/metrics … :{base + 1}/metrics, /livez and /readyz" in flat
        ), flat
        assert "(worker process 1 of 2)" in flat and "Address already in use" not in flat, flat
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, err.read_text()
    assert lbs.__version__ in err.read_text()
