"""Throwaway redis-server processes for demos and tests.

:class:`RedisServer` starts one server and :class:`RedisClusterServers` a
Redis Cluster (masters, optionally replicas) on free loopback ports, each in
its own temporary directory, and stops them again. They never touch port 6379
or a system Redis, and a server dies with the process that started it (Linux
``PR_SET_PDEATHSIG``), so even ``kill -9`` of a test run leaves nothing behind.

Binaries are found by :func:`find_redis_server`: ``$LBS_REDIS_SERVER``, then
``redis-server`` on PATH, then builds cached by ``scripts/redis.sh`` under
``~/.cache/lbs/redis/<version>/bin/``.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .exceptions import ConfigurationError, ServerNotFoundError, ServerStartError

__all__ = [
    "RedisClusterServers",
    "RedisServer",
    "find_redis_server",
    "redis_server_version",
]

Version = tuple[int, ...]

#: Oldest server lbs's own features are built for (XREADGROUP CLAIM).
MIN_VERSION: Version = (8, 4)

_VERSION_RE = re.compile(rb"v=(\d+(?:\.\d+)*)")


@functools.cache
def redis_server_version(binary: str) -> Version | None:
    """The version a redis-server binary reports, or None if it cannot run."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION_RE.search(out)
    return tuple(int(p) for p in m.group(1).split(b".")) if m else None


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "lbs" / "redis"


def _candidates(env_var: str) -> Iterable[str]:
    explicit = os.environ.get(env_var)
    if explicit:
        yield explicit
    on_path = shutil.which("redis-server")
    if on_path:
        yield on_path
    cache = _cache_dir()
    if cache.is_dir():
        builds = []
        for d in cache.iterdir():
            if re.fullmatch(r"\d+(\.\d+)*", d.name):
                builds.append((tuple(int(p) for p in d.name.split(".")), d))
        for _, d in sorted(builds, reverse=True):
            yield str(d / "bin" / "redis-server")
    yield "/usr/bin/redis-server"


def find_redis_server(
    min_version: Version | None = MIN_VERSION,
    below_version: Version | None = None,
    env_var: str = "LBS_REDIS_SERVER",
) -> str:
    """Return the path of a redis-server with ``min_version <= version < below_version``.

    Looks at ``$env_var``, PATH, the cache of ``scripts/redis.sh`` and
    ``/usr/bin``, in that order. Raises :class:`~lbs.ServerNotFoundError` with
    what to do when none fits.
    """
    seen: list[str] = []
    for path in _candidates(env_var):
        version = redis_server_version(path)
        if version is None:
            continue
        seen.append(f"{path} ({'.'.join(map(str, version))})")
        if min_version is not None and version < min_version:
            continue
        if below_version is not None and version >= below_version:
            continue
        return path
    wanted = []
    if min_version:
        wanted.append(">= " + ".".join(map(str, min_version)))
    if below_version:
        wanted.append("< " + ".".join(map(str, below_version)))
    hint = (
        "run scripts/redis.sh (it builds Redis 8.6 into ~/.cache/lbs) "
        if min_version and min_version >= (8, 0)
        else "install Debian's redis-server package "
    )
    raise ServerNotFoundError(
        f"no redis-server {' and '.join(wanted)} found"
        + (f" (saw: {', '.join(seen)})" if seen else "")
        + f"; {hint}or set {env_var} to one"
    )


# ------------------------------------------------------------------ ports ----


def _ephemeral_floor() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return low


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_taken_ports: set[int] = set()
_ports_lock = threading.Lock()


def free_port(with_bus: bool = False) -> int:
    """A free loopback port below the ephemeral range.

    Ports from the ephemeral range can be handed to outgoing connections at
    any moment, so they are avoided. With ``with_bus`` the cluster bus port
    (port + 10000) must be free and below the ephemeral range too.
    """
    top = _ephemeral_floor() - (10000 if with_bus else 0)
    low = 10000
    if top - low < 1000:
        raise ServerStartError(f"no usable port range below the ephemeral floor {top}")
    with _ports_lock:
        for _ in range(200):
            port = random.randrange(low, top)
            if port in _taken_ports or (with_bus and port + 10000 in _taken_ports):
                continue
            if _port_is_free(port) and (not with_bus or _port_is_free(port + 10000)):
                _taken_ports.add(port)
                return port
    raise ServerStartError("could not find a free loopback port")


# --------------------------------------------------------------- processes ----

_PR_SET_PDEATHSIG = 1
_live: set[RedisServer] = set()


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child
    # The server gets SIGKILL when the thread that started it dies, however
    # that happens (kill -9 included): the guarantee that nothing leaks. Note
    # "thread": start servers from a thread that outlives them (the main one).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        server.stop()


class RedisServer:
    """One redis-server process on a free loopback port, in its own temp directory.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. Start
    (and restart) it from a thread that outlives it, such as the main thread:
    the kernel kills the server when the starting *thread* exits.
    ``config`` entries are passed as ``--<name> <value>`` arguments, e.g.
    ``{"notify-keyspace-events": "Kx"}``.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        config: Mapping[str, str] | None = None,
        cluster: bool = False,
        start_timeout: float = 15.0,
        kill_with_parent: bool = True,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.host = "127.0.0.1"
        self._fixed_port = port
        self.port = port or 0
        self.config = dict(config or {})
        self.cluster = cluster
        self.start_timeout = start_timeout
        self.kill_with_parent = kill_with_parent
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def version(self) -> Version:
        v = redis_server_version(self.binary)
        assert v is not None
        return v

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path:
        assert self._dir is not None
        return Path(self._dir.name) / "redis.log"

    def client(self, **kwargs: object) -> redis.Redis:
        """A synchronous redis-py client for this server."""
        return redis.Redis(host=self.host, port=self.port, **kwargs)  # type: ignore[arg-type]

    def _argv(self) -> list[str]:
        assert self._dir is not None
        args = {
            "port": str(self.port),
            "bind": self.host,
            "dir": self._dir.name,
            "logfile": "redis.log",
            "save": "",
            "appendonly": "no",
            "daemonize": "no",
            "protected-mode": "yes",
        }
        if self.cluster:
            args.update(
                {
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": "2000",
                    # Replicas sync at once instead of waiting 5 s for more of them.
                    "repl-diskless-sync-delay": "0",
                    # CLUSTER SLOTS hides a replica until its replication offset
                    # moves, which with no writes takes a master PING: 10 s by default.
                    "repl-ping-replica-period": "1",
                }
            )
        args.update(self.config)
        argv = [self.binary]
        for name, value in args.items():
            argv += [f"--{name}", value]
        return argv

    def _spawn(self) -> None:
        self.process = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=functools.partial(_die_with_parent, os.getpid())
            if self.kill_with_parent
            else None,
        )

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING. Idempotent."""
        if self.process is not None:
            return self
        attempts = 1 if self._fixed_port else 5
        last = ""
        for _ in range(attempts):
            self._dir = tempfile.TemporaryDirectory(prefix="lbs-redis-")
            self.port = self._fixed_port or free_port(with_bus=self.cluster)
            self._spawn()
            _live.add(self)
            try:
                self._wait_ready()
                return self
            except ServerStartError as exc:
                last = str(exc)
                self.stop()
                if "in use" not in last:
                    break
        raise ServerStartError(last)

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        # No client-side retries: redis-py 8 backs off for seconds on a refused
        # connection, and this loop is the retry.
        no_retry = Retry(NoBackoff(), 0)
        with self.client(socket_connect_timeout=0.5, socket_timeout=1, retry=no_retry) as c:
            while True:
                if self.process.poll() is not None:
                    raise ServerStartError(
                        f"redis-server on port {self.port} exited with code "
                        f"{self.process.returncode}: {self._log_tail()}"
                    )
                try:
                    if c.ping():
                        return
                except redis.exceptions.BusyLoadingError:
                    pass
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"redis-server on port {self.port} did not answer within "
                        f"{self.start_timeout}s: {self._log_tail()}"
                    )
                time.sleep(0.01)

    def _log_tail(self, lines: int = 8) -> str:
        text = ""
        if (
            self.process is not None
            and self.process.stderr is not None
            and self.process.poll() is not None
        ):
            text = self.process.stderr.read().decode(errors="replace")
        try:
            text += self.log_path.read_text(errors="replace")
        except OSError:
            pass
        return " | ".join(text.strip().splitlines()[-lines:]) or "(no log output)"

    def restart(self, *, save: bool = True, wait: bool = True) -> RedisServer:
        """Shut the server down (saving its data to its RDB file unless ``save``
        is False) and start it again on the same port and directory; with
        ``wait`` False, return as soon as the new process runs (it may still
        be loading its data, answering ``LOADING``)."""
        proc = self.process
        if proc is None:
            raise ServerStartError("restart() needs a running server")
        with self.client(socket_timeout=10, retry=Retry(NoBackoff(), 0)) as c:
            try:
                c.shutdown(save=save, nosave=not save)
            except redis.exceptions.ConnectionError:
                pass  # the server closes the connection as it exits
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()
        self._spawn()
        if wait:
            self._wait_ready()
        return self

    def kill(self) -> None:
        """SIGKILL the server (a crash, for tests); :meth:`stop` still cleans up."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``) and remove its files."""
        proc, self.process = self.process, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        _live.discard(self)
        with _ports_lock:
            _taken_ports.discard(self.port)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        v = ".".join(map(str, redis_server_version(self.binary) or ()))
        return f"<RedisServer {v} {self.url} pid={self.pid}>"


def _cmd(c: redis.Redis, *args: str | int) -> Any:
    """One raw command (redis-py leaves execute_command untyped)."""
    return c.execute_command(*args)  # type: ignore[no-untyped-call]


def _cluster_info(c: redis.Redis) -> dict[str, str]:
    raw = _cmd(c, "CLUSTER", "INFO")
    if isinstance(raw, dict):  # redis-py already parsed it
        return {k: str(v) for k, v in raw.items()}
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class RedisClusterServers:
    """A Redis Cluster of ``masters`` masters (16384 slots split evenly) and
    ``replicas`` replicas per master, on free loopback ports.

    Built with CLUSTER ADDSLOTSRANGE, MEET and REPLICATE, then waited on
    until every node reports ``cluster_state:ok`` and knows every other node.
    """

    SLOTS = 16384

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 0,
        binary: str | None = None,
        *,
        config: Mapping[str, str] | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ConfigurationError("a cluster needs masters >= 1 and replicas >= 0")
        self.binary = binary or find_redis_server()
        self.masters_count = masters
        self.replicas_count = replicas
        self.config = dict(config or {})
        self.start_timeout = start_timeout
        self.nodes: list[RedisServer] = []

    @property
    def masters(self) -> list[RedisServer]:
        return self.nodes[: self.masters_count]

    @property
    def replicas(self) -> list[RedisServer]:
        return self.nodes[self.masters_count :]

    @property
    def url(self) -> str:
        """A URL of one node; redis-py's RedisCluster discovers the rest."""
        return self.nodes[0].url

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(n.host, n.port) for n in self.nodes]

    def start(self) -> RedisClusterServers:
        if self.nodes:
            return self
        try:
            total = self.masters_count * (1 + self.replicas_count)
            for _ in range(total):
                node = RedisServer(self.binary, cluster=True, config=self.config)
                self.nodes.append(node.start())
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        clients = [n.client(decode_responses=True) for n in self.nodes]
        try:
            ids = [_cmd(c, "CLUSTER", "MYID") for c in clients]
            per = self.SLOTS // self.masters_count
            for i, c in enumerate(clients[: self.masters_count]):
                first = i * per
                last = self.SLOTS - 1 if i == self.masters_count - 1 else first + per - 1
                _cmd(c, "CLUSTER", "ADDSLOTSRANGE", first, last)
            first_node = self.nodes[0]
            for c in clients[1:]:
                _cmd(c, "CLUSTER", "MEET", first_node.host, first_node.port)
            self._wait(
                clients,
                lambda c: _cluster_info(c)["cluster_known_nodes"] == str(len(self.nodes)),
                "every node to know every other node",
            )
            for r, c in enumerate(clients[self.masters_count :]):
                master_id = ids[r % self.masters_count]
                self._wait(
                    [c],
                    lambda c, m=master_id: m in _cmd(c, "CLUSTER", "NODES"),
                    "replicas to learn their master",
                )
                _cmd(c, "CLUSTER", "REPLICATE", master_id)
            self._wait(clients, self._node_ready, "cluster_state:ok on every node")
        finally:
            for c in clients:
                c.close()

    def _node_ready(self, c: redis.Redis) -> bool:
        info = _cluster_info(c)
        if info["cluster_state"] != "ok" or info["cluster_slots_ok"] != str(self.SLOTS):
            return False
        if info["cluster_known_nodes"] != str(len(self.nodes)):
            return False
        if self.replicas_count:
            # Replicas count once their initial sync is done: until then
            # CLUSTER SLOTS leaves them out and clients cannot see them.
            if c.info("replication").get("master_link_status", "up") != "up":
                return False
            for slot_range in _cmd(c, "CLUSTER", "SLOTS"):
                if len(slot_range) - 3 < self.replicas_count:
                    return False
        return True

    def _wait(self, clients: list[redis.Redis], ready: object, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not all(ready(c) for c in clients):  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"cluster did not converge within {self.start_timeout}s: waiting for {what}"
                )
            time.sleep(0.05)

    def client(self, **kwargs: object) -> redis.RedisCluster:
        """A synchronous redis-py RedisCluster client."""
        n = self.nodes[0]
        return redis.RedisCluster(host=n.host, port=n.port, **kwargs)  # type: ignore[arg-type]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    def __enter__(self) -> RedisClusterServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<RedisClusterServers masters={self.masters_count} replicas={self.replicas_count} nodes={[n.port for n in self.nodes]}>"


def _main(argv: list[str] | None = None) -> int:  # pragma: no cover - manual use
    """``python -m lbs.embedded``: print the redis-server that would be used."""
    try:
        print(find_redis_server())
    except ServerNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(_main())
