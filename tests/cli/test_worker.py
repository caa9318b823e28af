"""``lbs worker``: a real process on a real Redis, stopped with real signals; its settings and its errors."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs.embedded import free_port

from _cli_helpers import (
    HANDLERS,
    Proc,
    all_finished,
    cli_env,
    eventually,
    flat,
    handled,
    leftovers,
    run_lbs,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

StartWorker = Callable[..., Proc]


async def _markers(r: aioredis.Redis, service: str, *ids: str) -> list[bytes | None]:
    """The instance markers (this process's nonce) of the consumer ids: set once a worker is inside run()."""
    return [await r.get(lbs.lease_key(service, f"redis-consumer-{i}")) for i in ids]


@pytest.mark.parametrize("shards", [1, 2])
async def test_worker_processes_the_work_and_stops_cleanly_on_sigterm(
    redis_server: Any,
    r: aioredis.Redis,
    service: str,
    log: Path,
    start_worker: StartWorker,
    shards: int,
) -> None:
    names = [f"s{i}" for i in range(20)]
    async with lbs.Producer(r, service, shards=shards) as producer:
        await producer.add_streams(names)
    worker = start_worker(
        f"{HANDLERS}:ok",
        "--service",
        service,
        "--url",
        redis_server.url,
        "--consumer-id",
        "w1",
        "--shards",
        str(shards),
        "--lock-ttl",
        "5",
    )

    async def all_handled() -> bool:
        return {stream for _, stream, _ in handled(log)} == set(names)

    await eventually(all_handled, "every registered stream handled")
    await eventually(
        lambda: all_finished(r, service, shards), "every stream finished (acked and deleted)"
    )
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.err()
    for svc in lbs.shard_services(service, shards):
        assert await leftovers(r, svc) == (0, 0)
    assert {pid for pid, _, _ in handled(log)} == {str(worker.pid)}
    err = flat(worker.err())
    # the banner: version, service, LBS, Redis (connected), consumer id, settings and where they came from
    for text in (
        f"lbs {lbs.__version__} worker",
        service,
        f"Redis {'.'.join(map(str, redis_server.version))}",
        "redis-consumer-w1",
        "lock_ttl 5 s",
        "lock_ttl=5.0 (--lock-ttl)",
        "lbs-default-reader",
        "SIGTERM: stopping",
    ):
        assert text in err, err
    assert "Traceback" not in err


async def test_sigterm_drains_then_hands_back_without_a_retry(
    redis_server: Any, r: aioredis.Redis, service: str, log: Path, start_worker: StartWorker
) -> None:
    async with lbs.Producer(r, service) as producer:
        ids = await producer.add_streams(["slow-1", "slow-2"])
    worker = start_worker(
        f"{HANDLERS}:slow",
        "--service",
        service,
        "--url",
        redis_server.url,
        "--drain-timeout",
        "0.5",
    )

    async def both_started() -> bool:
        return len(handled(log, "started")) == 2

    await eventually(both_started, "both handlers running")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.err()
    assert "SIGTERM: stopping (drain 0.5s, then hand back)" in flat(worker.err())
    entries = await r.xrange(lbs.input_stream(service))
    # handed back as fresh entries: the old ones gone, no retry counted, nothing pending or locked
    assert sorted(lbs.decode_input(f[b"lbs-input"])[0] for _, f in entries) == ["slow-1", "slow-2"]
    assert not {i.decode() for i, _ in entries} & set(ids)
    assert all(int(f.get(b"_retry_count", b"0")) == 0 for _, f in entries), entries
    assert await leftovers(r, service) == (0, 0)


async def test_on_valkey_the_banner_names_it_and_lbs_claim_steps_aside(
    valkey_server: Any, service: str, log: Path, start_worker: StartWorker
) -> None:
    """Valkey answers INFO as Redis 7.2.4: the banner names Valkey and its own version; the retired
    lbs-claim, installed, steps aside with its one line."""
    async with lbs.Producer(valkey_server.url, service) as producer:
        await producer.add_streams(["v-1", "v-2"])
    claim = (
        importlib.util.find_spec("lbs_claim") is not None
    )  # installed: load it, it must step aside
    worker = start_worker(
        f"{HANDLERS}:ok",
        "--service",
        service,
        "--url",
        valkey_server.url,
        **({"LBS_LOAD_PLUGINS": "claim"} if claim else {}),
    )

    async def both_handled() -> bool:
        return {stream for _, stream, _ in handled(log)} == {"v-1", "v-2"}

    await eventually(both_handled, "both streams handled on Valkey")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.err()
    err = flat(worker.err())
    assert valkey_server.name in err and "Redis 7.2" not in err, err
    if claim:
        assert "lbs-claim is retired" in err
    async with aioredis.Redis.from_url(valkey_server.url) as r:
        assert await leftovers(r, service) == (0, 0)


async def test_supervisor_restarts_a_killed_child_and_stops_all_on_sigterm(
    redis_server: Any, r: aioredis.Redis, service: str, log: Path, start_worker: StartWorker
) -> None:
    ids = ("sup-0", "sup-1")
    supervisor = start_worker(
        f"{HANDLERS}:ok",
        "--service",
        service,
        "--url",
        redis_server.url,
        "--consumer-id",
        "sup",
        "--processes",
        "2",
        "--lock-ttl",
        "1",
    )

    async def both_running() -> bool:
        # The banner too: child 0 prints it once it started, and may be the one killed below.
        return (
            None not in await _markers(r, service, *ids)
            and len(supervisor.children()) == 2
            and f"lbs {lbs.__version__} worker" in flat(supervisor.err())
        )

    await eventually(both_running, "two children inside run(), the banner printed")
    before = await _markers(r, service, *ids)
    children = supervisor.children()
    victim = min(children)
    os.kill(victim, signal.SIGKILL)

    async def replaced() -> bool:
        now = await _markers(r, service, *ids)
        kids = supervisor.children()
        return None not in now and now != before and len(kids) == 2 and victim not in kids

    await eventually(replaced, "the killed child replaced by a new one, inside run()")
    assert len(supervisor.children() - children) == 1
    names = [f"after-{i}" for i in range(10)]
    async with lbs.Producer(r, service) as producer:
        await producer.add_streams(names)

    async def all_handled() -> bool:
        return {stream for _, stream, _ in handled(log)} >= set(names)

    await eventually(all_handled, "the work handled after the restart")
    await eventually(lambda: all_finished(r, service), "every stream finished")
    last = supervisor.children()
    supervisor.signal(signal.SIGTERM)
    assert await supervisor.wait() == 0, supervisor.err()
    for pid in last:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        )
    assert await leftovers(r, service) == (0, 0)
    err = flat(supervisor.err())
    assert f"(pid {victim}) was killed by SIGKILL; restarting it in" in err, err
    assert "SIGTERM: stopping 2 worker processes" in err
    assert err.count(f"lbs {lbs.__version__} worker") == 1  # one banner, from the first child
    assert "Traceback" not in err


async def test_supervisor_gives_up_on_a_child_that_keeps_crashing(
    log: Path, start_worker: StartWorker
) -> None:
    # Nobody listens on this port: every child exits 1 at start, again and again.
    supervisor = start_worker(
        f"{HANDLERS}:ok",
        "--service",
        "s",
        "--url",
        f"redis://:secret@127.0.0.1:{free_port()}",
        "--processes",
        "2",
    )
    assert await supervisor.wait(timeout=180) == 1
    err = flat(supervisor.err())
    assert "in a row: giving up; stopping the others" in err, err
    assert "restarting it in 0.5s" in err and "restarting it in 4.0s" in err
    assert "secret" not in err and "redis://:***@127.0.0.1" in err
    assert "Traceback" not in err


def test_redis_unreachable_at_start_is_exit_1_with_a_message(log: Path) -> None:
    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    proc = run_lbs(["worker", f"{HANDLERS}:ok", "--service", "s", "--url", url], cli_env(log))
    assert proc.returncode == 1, proc.stderr
    assert "cannot connect to Redis at redis://user:***@127.0.0.1" in flat(proc.stderr)
    assert "connection refused" in proc.stderr and "--url" in proc.stderr
    assert "secret" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------- settings ---


def test_settings_precedence_flags_over_env_over_file(tmp_path: Path, log: Path) -> None:
    config = tmp_path / "lbs.toml"
    config.write_text(
        '[lbs]\nlock_ttl = 7\nmax_streams = 3\nread_count = 2\nhandler_timeout = "none"\n\n'
        '[myapp]\nanything = "left alone"\n'
    )
    env = cli_env(log, LBS_LOCK_TTL="8", LBS_MAX_STREAMS="4", LBS_RECOVERY="off", LBS_LOCK_TLL="1")
    proc = run_lbs(
        [
            "worker",
            f"{HANDLERS}:ok",
            "--service",
            "s",
            "--config",
            str(config),
            "--lock-ttl",
            "9",
            "--set",
            "drain_timeout=2.5",
            "--timeout",
            "30",
            "--check",
        ],
        env,
    )
    assert proc.returncode == 0, proc.stderr
    table = tomllib.loads(proc.stdout)["lbs"]
    assert table["lock_ttl"] == 9.0  # flag > env > file
    assert table["max_streams"] == 4  # env > file
    assert table["read_count"] == 2  # file > default
    assert (
        table["recovery"] is False
        and table["drain_timeout"] == 2.5
        and table["handler_timeout"] == 30.0
    )
    assert table["max_retries"] == lbs.Config().max_retries  # default
    assert lbs.Config(
        **{k: (None if v == "none" else v) for k, v in table.items()}
    )  # the output is a valid Config
    for line in (
        "lock_ttl = 9.0  # --lock-ttl",
        "max_streams = 4  # environment LBS_MAX_STREAMS",
        f"read_count = 2  # {config} [lbs] read_count",
        "drain_timeout = 2.5  # --set drain_timeout",
        "handler_timeout = 30.0  # --timeout",
    ):
        assert line in proc.stdout.splitlines(), proc.stdout
    assert "LBS_LOCK_TLL is not a Config field's; did you mean LBS_LOCK_TTL?" in flat(proc.stderr)


@pytest.mark.parametrize(
    "args, env, message",
    [
        (
            ["--set", "lock_ttl=-1"],
            {},
            "Config.lock_ttl must be a positive number, got -1.0 (lock_ttl from --set lock_ttl)",
        ),
        (
            [],
            {"LBS_LOCK_TTL": "abc"},
            "environment LBS_LOCK_TTL: Config.lock_ttl takes a number, got 'abc'",
        ),
        (
            [],
            {"LBS_RECOVERY": "maybe"},
            "environment LBS_RECOVERY: Config.recovery takes true or false, got 'maybe'",
        ),
        (
            ["--set", "lock_tll=3"],
            {},
            "--set lock_tll: Config has no field 'lock_tll'; did you mean 'lock_ttl'?",
        ),
        (
            ["--lock-ttl", "3", "--set", "heartbeat_interval=5"],
            {},
            "must be shorter than lock_ttl (3.0), or the lease expires between heartbeats "
            "(heartbeat_interval from --set heartbeat_interval; lock_ttl from --lock-ttl)",
        ),
        (["--config", "{tmp}/missing.toml"], {}, "cannot read the config file"),
        (["--config", "{tmp}/bad.toml"], {}, "is not valid TOML"),
        (
            ["--config", "{tmp}/typo.toml"],
            {},
            "[lbs] max_stream: Config has no field 'max_stream'; did you mean 'max_streams'?",
        ),
        (
            ["--config", "{tmp}/top.toml"],
            {},
            "sets lock_ttl at the top level: put lbs's settings under an [lbs] table",
        ),
    ],
)
def test_an_invalid_setting_is_exit_78_with_its_source(
    tmp_path: Path, log: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    (tmp_path / "bad.toml").write_text("[lbs\n")
    (tmp_path / "typo.toml").write_text("[lbs]\nmax_stream = 3\n")
    (tmp_path / "top.toml").write_text("lock_ttl = 3\n")
    argv = [
        "worker",
        f"{HANDLERS}:ok",
        "--service",
        "s",
        *(a.replace("{tmp}", str(tmp_path)) for a in args),
    ]
    proc = run_lbs(argv, cli_env(log, **env))
    assert proc.returncode == 78, proc.stderr
    assert "lbs worker: error: invalid configuration: " in proc.stderr
    assert message in flat(proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--set", "lock_ttl"], "--set takes FIELD=VALUE"),
        (["--set", "lock_ttl=3", "--lock-ttl", "4"], "lock_ttl is given twice"),
        (["--processes", "0"], "--processes"),
        (["--log-level", "loud"], "'loud' is not one of 'debug', 'info', 'warning', 'error'"),
    ],
)
def test_a_usage_error_is_exit_2(log: Path, args: list[str], message: str) -> None:
    proc = run_lbs(["worker", f"{HANDLERS}:ok", "--service", "s", *args, "--check"], cli_env(log))
    assert proc.returncode == 2, proc.stderr
    assert message in flat(proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


def test_service_is_required(log: Path) -> None:
    proc = run_lbs(["worker", f"{HANDLERS}:ok", "--check"], cli_env(log))
    assert proc.returncode == 2 and "Missing option '--service'" in flat(proc.stderr), proc.stderr
    proc = run_lbs(["worker", f"{HANDLERS}:ok", "--check"], cli_env(log, LBS_SERVICE="from-env"))
    assert proc.returncode == 0 and "from-env-input" in flat(proc.stderr), proc.stderr


# -------------------------------------------------------------- handler ---


@pytest.mark.parametrize(
    "target, message",
    [
        (HANDLERS, f"expected MODULE:HANDLER (e.g. myapp.workers:handle), got '{HANDLERS}'"),
        ("tests.cli.nowhere:ok", "no module named 'tests.cli.nowhere'"),
        (f"{HANDLERS}:missing", f"module '{HANDLERS}' has no attribute 'missing'"),
        (f"{HANDLERS}:not_callable", f"{HANDLERS}:not_callable is not callable (a int)"),
        (f"{HANDLERS}:sync", "is not an async function"),
        (f"{HANDLERS}:two_args", "must take one argument, the lbs.Notification"),
    ],
)
def test_a_bad_handler_is_a_usage_error(log: Path, target: str, message: str) -> None:
    proc = run_lbs(["worker", target, "--service", "s"], cli_env(log))
    assert proc.returncode == 2, proc.stderr
    assert "Invalid value for 'MODULE:HANDLER'" in flat(proc.stderr)
    assert message in flat(proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_handler_module_that_raises_shows_its_traceback(log: Path) -> None:
    proc = run_lbs(["worker", "tests.cli._broken:handle", "--service", "s"], cli_env(log))
    assert proc.returncode == 1, proc.stderr
    assert "RuntimeError: boom at import" in proc.stderr
    assert (
        "_broken.py" in proc.stderr and "importlib" not in proc.stderr
    )  # the application's frames only
    assert "importing 'tests.cli._broken' failed" in proc.stderr


def test_the_app_dir_is_where_the_module_is_found(tmp_path: Path, log: Path) -> None:
    (tmp_path / "myapp.py").write_text("async def handle(note):\n    pass\n")
    env = cli_env(log)
    proc = run_lbs(["worker", "myapp:handle", "--service", "s", "--check"], env)
    assert proc.returncode == 2 and "no module named 'myapp'" in flat(proc.stderr), proc.stderr
    proc = run_lbs(
        ["worker", "myapp:handle", "--service", "s", "--check", "--app-dir", str(tmp_path)], env
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
        ("redis://user:pw@h", "redis://user:***@h"),
        ("redis://secret@h", "redis://***@h"),
        (
            "rediss://u:p@h/0?password=x&ssl_cert_reqs=none",
            "rediss://u:***@h/0?password=***&ssl_cert_reqs=none",
        ),
        ("unix:///tmp/redis.sock?db=1&password=z", "unix:///tmp/redis.sock?db=1&password=***"),
    ],
)
def test_urls_are_printed_without_their_secrets(url: str, shown: str) -> None:
    from lbs.cli._common import mask_url

    assert mask_url(url) == shown
