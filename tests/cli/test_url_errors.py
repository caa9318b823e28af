"""One CLI: a URL mistake gets the same exit code in every command and a one-line error with its fix
(a missing or wrong password, TLS against a plain port); the URL option is ``--url`` everywhere."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from lbs.embedded import RedisServer, free_port

from _cli_helpers import cli_env, run_lbs
from _pty import flat, invoke

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def locked() -> Iterator[str]:
    """A server that wants the password ``sekrit`` (set after start: the readiness check has none)."""
    with RedisServer() as server:

        async def lock() -> None:
            r = aioredis.Redis.from_url(server.url)
            await r.config_set("requirepass", "sekrit")
            await r.aclose()

        asyncio.run(lock())
        yield server.url


@pytest.mark.parametrize("command", [["status", "svc"], ["dlq", "list", "svc"]])
async def test_a_missing_password_says_where_it_goes(locked: str, command: list[str]) -> None:
    result = await invoke(*command, "--url", locked)
    assert result.exit_code == 1
    out = flat(result.output)
    assert "wants a password" in out and "redis://:PASSWORD@HOST:PORT" in out and "HELLO" not in out


async def test_a_wrong_password_is_named_without_showing_it(locked: str) -> None:
    url = locked.replace("redis://", "redis://:wrong@")
    result = await invoke("status", "svc", "--url", url)
    assert result.exit_code == 1
    out = flat(result.output)
    assert "refused the user or password" in out and "wrong" not in out.replace("WRONGPASS", "")


async def test_tls_against_a_plain_port_says_to_use_redis(locked: str) -> None:
    url = locked.replace("redis://", "rediss://:sekrit@")
    result = await invoke("status", "svc", "--url", url)
    assert result.exit_code == 1
    out = flat(result.output)
    assert "no TLS handshake" in out and "use redis://" in out and "sekrit" not in out


@pytest.mark.parametrize(
    "command",
    [
        ["status", "svc"],
        ["dlq", "list", "svc"],
        ["claim", "svc", "1-1"],
        ["worker", "tests.cli._handlers:ok", "--service", "svc"],
    ],
)
def test_a_bad_url_exits_78_in_every_command(command: list[str], tmp_path: Path) -> None:
    proc = run_lbs([*command, "--url", "http://nowhere"], cli_env(tmp_path / "log"))
    assert proc.returncode == 78, (proc.returncode, proc.stderr)
    assert "http://nowhere" in proc.stderr


def test_the_demo_takes_url_and_keeps_redis_url(tmp_path: Path) -> None:
    proc = run_lbs(["demo", "--help"], cli_env(tmp_path / "log"))
    assert proc.returncode == 0
    out = flat(proc.stdout)
    assert "--url" in out and "--redis-url" in out


def test_a_bad_service_name_exits_78_in_the_worker_too(tmp_path: Path) -> None:
    proc = run_lbs(
        ["worker", "tests.cli._handlers:ok", "--service", "a{b}"], cli_env(tmp_path / "log")
    )
    assert proc.returncode == 78, (proc.returncode, proc.stderr)
    assert "service must not contain" in flat(proc.stderr)


@pytest.mark.parametrize(
    "command",
    [
        ["status", "svc"],
        ["dlq", "list", "svc"],
        ["claim", "svc", "1-1"],
        ["worker", "tests.cli._handlers:ok", "--service", "svc"],
        ["dashboard", "svc"],
    ],
    ids=["status", "dlq list", "claim", "worker", "dashboard"],
)
def test_a_refused_connection_is_one_line_naming_the_url_and_the_fix(
    command: list[str], tmp_path: Path
) -> None:
    """Nothing listens on the port: one line naming the (masked) URL, why, and --url / LBS_URL; exit 1."""
    port = free_port()
    proc = run_lbs([*command, "--url", f"redis://:pw-secret@127.0.0.1:{port}"], cli_env(tmp_path))
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    said = flat(lines[0])
    assert f"cannot connect to Redis at redis://:***@127.0.0.1:{port} (connection refused)" in said
    assert "--url" in said and "LBS_URL" in said, said
    assert "pw-secret" not in proc.stderr + proc.stdout
