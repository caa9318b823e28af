"""The demo, in-process and through the command line, on its own embedded Redis and with ``--redis-url``.

The command line runs step 1 as a Spark job when pyspark (and Java) are
there; the in-process run and ``--no-spark`` stand in for a machine without
pyspark, so the suite starts Spark once and covers both ways the work gets
registered.

With ``--redis-url`` the demo shares a Redis with other data: every key it
writes or deletes must be one of its service's (``_demo.demo_keys``), it must
leave none behind, and it must refuse at once, writing nothing, when keys of
that service are already there. The keyspace notifications of every write
and delete (``notify-keyspace-events KA``) say which keys it touched.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from lbs import _demo
from lbs._demo import MIN_REDIS, POISON_MAX_RETRIES, demo_keys, find_demo_keys, run_demo
from lbs.embedded import MIN_VERSION, RedisServer, find_redis_server, server_product

#: None when the demo's step 1 runs as a Spark job here (pyspark, pyarrow and a Java runtime).
SPARK_UNAVAILABLE = _demo._spark_unavailable()
#: Bounds for the demo's processes on a loaded 2-core machine (Spark's start included where it runs).
DEMO_TIMEOUT = 600


def _lbs(*args: str, timeout: float = DEMO_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``python -m lbs ARGS`` to completion, without the developer's LBS_* settings (but the server binary)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("LBS_") or k == "LBS_REDIS_SERVER"
    }
    env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-m", "lbs", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture(scope="module", params=["redis8", "redis7", "valkey"])
def own_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A Redis 8.x, then Debian's 7.0, then Valkey, of this module's own: no other test's keys are
    written or expire there."""
    if request.param == "redis8":
        binary = find_redis_server()
    else:
        # Skipped (or failed, with LBS_REQUIRE_REDIS7=1 / LBS_REQUIRE_VALKEY=1) as the suite's others are.
        binary = request.getfixturevalue(f"{request.param}_server").server.binary
    with RedisServer(binary) as server:
        yield server


def _is_demo_key(service: str, key: str) -> bool:
    names, prefixes = demo_keys(service)
    return key in names or key.startswith(tuple(prefixes))


async def _snapshot(r: aioredis.Redis) -> dict[bytes, bytes]:
    """Every key with its DUMP: what a run must leave as it found it."""
    return {k: await r.dump(k) async for k in r.scan_iter(count=1000)}


@asynccontextmanager
async def _touched(r: aioredis.Redis) -> AsyncIterator[set[str]]:
    """The keys written or deleted (keyspace notifications of every kind) while the block runs.

    The set is complete on exit: a marker key is written last, and its
    notification comes after every earlier one.
    """
    old = (await r.config_get("notify-keyspace-events"))["notify-keyspace-events"]
    await r.config_set("notify-keyspace-events", "KA")
    db = r.connection_pool.connection_kwargs.get("db", 0)
    channel = f"__keyspace@{db}__:"
    touched: set[str] = set()
    pubsub = r.pubsub()
    try:
        await pubsub.psubscribe(channel + "*")
        confirmed = await pubsub.get_message(timeout=60)  # the subscription is in place
        assert confirmed is not None and confirmed["type"] == "psubscribe", confirmed
        yield touched
        marker = f"test-demo-marker-{uuid.uuid4().hex}"
        await r.set(marker, 1)
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if msg is not None:
                key = msg["channel"].decode()[len(channel) :]
                if key == marker:
                    break
                touched.add(key)
            assert asyncio.get_running_loop().time() < deadline, (
                "the marker's notification never came"
            )
        await r.delete(marker)
    finally:
        await pubsub.aclose()
        await r.config_set("notify-keyspace-events", old)


async def test_demo_processes_everything_and_leaves_nothing(  # type: ignore[no-untyped-def]
    redis_server, r: aioredis.Redis, service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a machine without pyspark: the producer registers the work.
    monkeypatch.setattr(
        _demo,
        "_spark_unavailable",
        lambda: "pyspark not installed (pip install 'lbs-streams[spark]')",
    )
    lines: list[str] = []
    result = await run_demo(
        redis_server.url, service=service, streams=8, consumers=2, out=lines.append
    )
    assert result.ok, lines
    assert result.source == "producer"
    assert (
        "pyspark not installed (pip install 'lbs-streams[spark]'): registering with lbs.Producer instead"
        in lines
    )
    # 8, the two handed back on shutdown, and the one whose consumer was killed
    assert sum(result.processed.values()) == 8 + 2 + 1
    assert (result.leftover_pending, result.leftover_entries, result.leftover_leases) == (0, 0, 0)
    assert any("registered 8 data streams" in line for line in lines)
    assert any(
        f"{{{service}-input}}:session-3 (token" in line and "user u2" in line for line in lines
    ), lines
    assert result.handed_back >= 1
    assert result.crash_recovery_s > 0 and any("killed with SIGKILL" in line for line in lines)
    # the malformed entry and the poison pill, after its first attempt and max_retries retries
    assert result.dead_letters == 2 and result.poison_retries == POISON_MAX_RETRIES + 1
    assert await find_demo_keys(r, service) == []


@pytest.mark.timeout(900)
def test_demo_command_on_an_embedded_redis() -> None:
    proc = _lbs("demo", "--streams", "4", timeout=800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "embedded Redis 8." in proc.stdout
    if SPARK_UNAVAILABLE is None:
        # The pipeline starts from a Spark job: the lbs sink wrote the events and registered the streams.
        assert (
            "spark: the work came from a Spark job: the lbs sink appended 12 rows (events) to 4 data streams "
            "and registered 4 data streams in demo-input" in proc.stdout
        ), proc.stdout
        assert f"it takes {_demo.SPARK_JOB_TIME} on 2 cores" in proc.stdout
        assert "Spark stopped" in proc.stdout
        # registered with an empty Info: the handler found the users in the events
        assert "{demo-input}:session-2 (token" in proc.stdout and "user u1)" in proc.stdout
    else:
        assert f"{SPARK_UNAVAILABLE}: registering with lbs.Producer instead" in proc.stdout
    assert "malformed entry" in proc.stdout and "dead letter: '{not json'" in proc.stdout
    assert "cleaned up: deleted the demo's" in proc.stdout
    assert proc.stdout.rstrip().endswith("lbs demo: OK")


async def test_no_spark_with_redis_url_touches_only_its_service_and_leaves_nothing(
    own_server: RedisServer, service: str
) -> None:
    """On Redis 8.x, 7.0 and Valkey: --no-spark registers with lbs.Producer; every key written is the
    service's; the demo names the server (Valkey by its own version, not the Redis one it answers as)."""
    async with aioredis.Redis.from_url(own_server.url) as r:
        # Someone else's data, under the names the demo used to write whatever --service said.
        others = {
            "session-1": "keep",
            "late-1": "keep",
            "demo-input": "not ours",
            "{demo-input}:dlq": "not ours",
        }
        for key, value in others.items():
            await r.set(f"{key}", value)
        try:
            before = await _snapshot(r)
            async with _touched(r) as touched:
                proc = await asyncio.to_thread(
                    _lbs,
                    "demo",
                    "--no-spark",
                    "--redis-url",
                    own_server.url,
                    "--service",
                    service,
                    "--streams",
                    "3",
                )
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert (
                "Spark skipped (--no-spark): registering with lbs.Producer instead" in proc.stdout
            )
            assert "spark: starting" not in proc.stdout
            product = server_product(own_server.binary)
            assert f"server: {product} {'.'.join(map(str, own_server.version))}\n" in proc.stdout
            assert proc.stdout.rstrip().endswith("lbs demo: OK")
            assert touched, "no keyspace notification came: the check sees nothing"
            assert {k for k in touched if not _is_demo_key(service, k)} == set()
            assert any(
                k.startswith(f"{{{service}-input}}:session-") for k in touched
            )  # the data streams
            assert await find_demo_keys(r, service) == []
            assert await _snapshot(r) == before
        finally:
            await r.delete(*others)


@pytest.mark.parametrize(
    "existing",
    [
        "{s}-input",
        "{{{s}-input}}:dlq",
        "lock:{{{s}-tickets-input}}:1-0",
        "{{{s}-tickets-input}}:k:ticket-1",
    ],
)
async def test_keys_of_the_service_already_there_stop_the_demo_at_once(
    own_server: RedisServer, service: str, existing: str
) -> None:
    key = existing.format(s=service)
    async with aioredis.Redis.from_url(own_server.url) as r:
        await r.set(key, "someone else's")
        try:
            await _refused(r, own_server.url, service, key)
        finally:
            await r.delete(key)


async def _refused(r: aioredis.Redis, url: str, service: str, key: str) -> None:
    """The demo, run with ``service`` while ``key`` exists, refuses at once and touches nothing."""
    before = await _snapshot(r)
    async with _touched(r) as touched:
        proc = await asyncio.to_thread(
            _lbs, "demo", "--redis-url", url, "--service", service, timeout=120
        )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert "\n" not in error and "Traceback" not in error, error
    assert error.startswith(
        "lbs demo: error: this Redis already has keys that the demo with service "
        f"'{service}' would write and delete ({key}; its keys are {service}-input, "
        f"{{{service}-input}}:*, lock:{{{service}-input}}:* and the same for "
        f"{service}-tickets): pick another --service"
    ), error
    assert "processed" not in proc.stdout
    assert touched == set()
    assert await _snapshot(r) == before


async def test_an_unreachable_redis_is_one_line_too(service: str) -> None:
    proc = await asyncio.to_thread(
        _lbs, "demo", "--redis-url", "redis://127.0.0.1:1", "--service", service, timeout=120
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.startswith(
            "lbs demo: error: cannot connect to Redis at redis://127.0.0.1:1 (connection refused): "
        )
        and "--url" in proc.stderr
        and proc.stderr.count("\n") == 1
    ), proc.stderr


def test_help_describes_the_demo() -> None:
    # rich's box drawing out, one space between words: what the wrapped help says.
    out = " ".join(
        re.sub("[\u2500-\u257f]", " ", _lbs("demo", "--help", timeout=120).stdout).split()
    )
    assert "Spark job" in out
    for option in ("--streams", "--consumers", "--service", "--redis-url", "--no-spark"):
        assert option in out
    # The keys it names are the ones the code writes, and the versions are the code's.
    assert (
        "<service>-input, {<service>-input}:* or lock:{<service>-input}:*, or the same for <service>-tickets"
        in out
    )
    assert demo_keys("S") == (
        ["S-input", "S-tickets-input"],
        ["{S-input}:", "lock:{S-input}:", "{S-tickets-input}:", "lock:{S-tickets-input}:"],
    )
    assert f"Redis (>= {'.'.join(map(str, MIN_REDIS))})" in out
    assert f"redis-server (>= {'.'.join(map(str, MIN_VERSION))}" in out
