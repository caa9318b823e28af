"""The ``lbs`` command takes ``redis+sentinel://`` URLs: ``lbs worker --check`` (no connection),
a URL that does not fit (exit 78, the form named, the password masked), and ``lbs status`` on a
real Sentinel set (lbs.embedded.sentinel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lbs.embedded.sentinel import SentinelSet

from _cli_helpers import HANDLERS, cli_env, flat, run_lbs
from _helpers import produce
from _pty import invoke

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_worker_check_takes_a_sentinel_url(log: Path) -> None:
    url = "redis+sentinel://:hunter22@10.0.0.1:26379,[::1]:26380/orders-master/2?sentinel_password=s3cret1"
    proc = run_lbs(
        ["worker", f"{HANDLERS}:ok", "--service", "s", "--url", url, "--check"], cli_env(log)
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "hunter22" not in out and "s3cret1" not in out


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://:hunter22@10.0.0.1:26379", "no service name"),
        ("redis+sentinel://:hunter22@::1/m", "needs brackets"),
    ],
)
def test_a_sentinel_url_that_does_not_fit_is_exit_78(log: Path, url: str, why: str) -> None:
    proc = run_lbs(
        ["worker", f"{HANDLERS}:ok", "--service", "s", "--url", url, "--check"], cli_env(log)
    )
    assert proc.returncode == 78, proc.stderr
    text = flat(proc.stderr)
    assert why in text and "redis+sentinel://[[user]:password@]host:port" in text, text
    assert "hunter22" not in proc.stderr and "Traceback" not in proc.stderr
    result = run_lbs(["status", "s", "--url", url], cli_env(log))
    assert result.returncode == 78 and why in flat(result.stderr), result.stderr


async def test_status_through_sentinel(service: str) -> None:
    with SentinelSet(password="pw-1") as sentinels:
        await produce(sentinels.url, service, "a", "b", "c")
        result = await invoke("status", service, "--url", sentinels.url, "--json")
        assert result.exit_code == 0, result.stdout
        assert json.loads(result.stdout)["backlog"] == 3
