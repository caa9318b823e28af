"""One throwaway redis-server process (:class:`RedisServer`), dying with the thread that started it."""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..exceptions import ServerStartError
from .binaries import Version, find_redis_server, redis_server_version, server_product
from .ports import free_port, release_port

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
            # prctl must run in the child, before exec: the only way to tie its death to ours.
            preexec_fn=functools.partial(_die_with_parent, os.getpid())  # noqa: PLW1509
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
        release_port(self.port)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        v = ".".join(map(str, redis_server_version(self.binary) or ()))
        return f"<RedisServer {server_product(self.binary)} {v} {self.url} pid={self.pid}>"
