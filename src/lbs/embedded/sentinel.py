"""A throwaway Redis Sentinel setup on loopback (:class:`SentinelSet`): a master, its replicas and
Sentinels (``redis-server --sentinel``, the same binary), for tests of ``redis+sentinel://`` and of
failovers. Start it from a thread that outlives it (see :class:`RedisServer`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..exceptions import ServerStartError
from .server import RedisServer

__all__ = ["DataServer", "SentinelServer", "SentinelSet"]

_NO_RETRY = Retry(NoBackoff(), 0)


class DataServer(RedisServer):
    """A redis-server that starts as a replica of ``replicaof`` (host, port) when it is set."""

    def __init__(
        self,
        binary: str | None = None,
        *,
        replicaof: tuple[str, int] | None = None,
        config: dict[str, str] | None = None,
    ) -> None:
        super().__init__(binary, config=config)
        self.replicaof = replicaof

    def _argv(self) -> list[str]:
        argv = super()._argv()
        if self.replicaof is not None:  # two arguments: one "--replicaof 'h p'" would not parse
            argv += ["--replicaof", self.replicaof[0], str(self.replicaof[1])]
        return argv

    def client(self, **kwargs: Any) -> redis.Redis:
        password = self.config.get("requirepass")
        return super().client(**({"password": password} if password else {}), **kwargs)


class SentinelServer(RedisServer):
    """``redis-server <conf> --sentinel`` monitoring one master (Sentinel needs a config file it can
    rewrite: written in the server's temp directory)."""

    def __init__(
        self,
        master: tuple[str, int],
        *,
        name: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        auth_pass: str | None = None,
        requirepass: str | None = None,
        binary: str | None = None,
    ) -> None:
        super().__init__(binary)
        self.master, self.name, self.quorum = master, name, quorum
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.auth_pass, self.requirepass = auth_pass, requirepass

    def client(self, **kwargs: Any) -> redis.Redis:
        return super().client(
            **({"password": self.requirepass} if self.requirepass else {}), **kwargs
        )

    def _argv(self) -> list[str]:
        assert self._dir is not None
        n = self.name
        lines = [
            f"port {self.port}",
            f"bind {self.host}",
            f"dir {self._dir.name}",
            "logfile redis.log",
            "daemonize no",
            "protected-mode no",
            f"sentinel monitor {n} {self.master[0]} {self.master[1]} {self.quorum}",
            f"sentinel down-after-milliseconds {n} {self.down_after_ms}",
            f"sentinel failover-timeout {n} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {n} 1",
        ]
        if self.auth_pass:
            lines.append(f"sentinel auth-pass {n} {self.auth_pass}")
        if self.requirepass:
            lines.append(f"requirepass {self.requirepass}")
        conf = Path(self._dir.name) / "sentinel.conf"
        conf.write_text("\n".join(lines) + "\n")
        return [self.binary, str(conf), "--sentinel"]


class SentinelSet:
    """One master, ``replicas`` replicas and ``sentinels`` Sentinels (quorum ``quorum``) on loopback.

    ``with SentinelSet() as s:`` starts them and waits until every Sentinel knows the replicas and
    the other Sentinels (so a failover can happen); :attr:`url` is the ``redis+sentinel://`` URL.
    ``password`` is the data servers' ``requirepass`` (and ``masterauth``), ``sentinel_password``
    the Sentinels' own.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        name: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        password: str | None = None,
        sentinel_password: str | None = None,
        binary: str | None = None,
        start_timeout: float = 30.0,
    ) -> None:
        self.name, self.binary, self.start_timeout = name, binary, start_timeout
        self.password, self.sentinel_password = password, sentinel_password
        self._replicas, self._sentinels = replicas, sentinels
        self._sentinel_args: dict[str, Any] = dict(
            name=name,
            quorum=quorum,
            down_after_ms=down_after_ms,
            failover_timeout_ms=failover_timeout_ms,
            auth_pass=password,
            requirepass=sentinel_password,
        )
        self.nodes: list[DataServer] = []
        self.sentinels: list[SentinelServer] = []

    def _config(self) -> dict[str, str]:
        config = {"repl-diskless-sync-delay": "0", "repl-ping-replica-period": "1"}
        if self.password:
            config.update(requirepass=self.password, masterauth=self.password)
        return config

    @property
    def url(self) -> str:
        """``redis+sentinel://[:password@]host:port,.../name``: the master's password, if any."""
        auth = f":{self.password}@" if self.password else ""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{self.name}"

    def start(self) -> SentinelSet:
        try:
            master = DataServer(self.binary, config=self._config())
            self.nodes.append(master)
            master.start()
            for _ in range(self._replicas):
                node = DataServer(
                    self.binary, replicaof=(master.host, master.port), config=self._config()
                )
                self.nodes.append(node)
                node.start()
            for _ in range(self._sentinels):
                s = SentinelServer(
                    (master.host, master.port), binary=self.binary, **self._sentinel_args
                )
                self.sentinels.append(s)
                s.start()
            self.wait_ready(master)
        except BaseException:
            self.stop()
            raise
        return self

    def _until(self, what: str, check: Any, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while True:
            try:
                if check():
                    return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"Sentinel set: {what} not within {timeout or self.start_timeout}s"
                )
            time.sleep(0.05)

    def wait_ready(self, master: DataServer) -> None:
        """Until the replicas are in sync with ``master`` and every Sentinel names it, sees the
        replicas up and knows every other Sentinel."""
        replicas = [n for n in self.nodes if n is not master and n.process is not None]

        def synced() -> bool:
            for node in replicas:
                with node.client(socket_timeout=2, retry=_NO_RETRY) as c:
                    if c.info("replication").get("master_link_status") != "up":
                        return False
            return True

        def known() -> bool:
            for s in self.sentinels:
                with s.client(socket_timeout=2, retry=_NO_RETRY) as c:
                    state = c.sentinel_master(self.name)
                    ups = [
                        r
                        for r in c.sentinel_slaves(self.name)
                        if not (r["is_sdown"] or r["is_odown"])
                    ]
                    if (
                        int(state["port"]) != master.port
                        or state["num-other-sentinels"] < len(self.sentinels) - 1
                        or len(ups) < len(replicas)
                    ):
                        return False
            return True

        self._until("replicas in sync", synced)
        self._until("Sentinels aware of each other and of the replicas", known)

    def master_address(self) -> tuple[str, int] | None:
        """The master's address as the first Sentinel that answers names it."""
        for s in self.sentinels:
            try:
                with s.client(socket_timeout=2, retry=_NO_RETRY) as c:
                    addr = c.sentinel_get_master_addr_by_name(self.name)
                    if addr:
                        return str(addr[0]), int(addr[1])
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                continue
        return None

    def master(self) -> DataServer:
        """The data server the Sentinels name as master."""
        addr = self.master_address()
        for node in self.nodes:
            if addr is not None and node.port == addr[1]:
                return node
        raise ServerStartError(f"no data server at the master's address {addr}")

    def wait_promoted(self, old: DataServer, timeout: float = 60.0) -> DataServer:
        """Until the Sentinels name another data server than ``old`` and it says it is a master."""
        out: list[DataServer] = []

        def promoted() -> bool:
            addr = self.master_address()
            if addr is None or addr[1] == old.port:
                return False
            node = next(n for n in self.nodes if n.port == addr[1])
            with node.client(socket_timeout=2, retry=_NO_RETRY) as c:
                if c.info("replication").get("role") != "master":
                    return False
            out.append(node)
            return True

        self._until("a replica promoted", promoted, timeout)
        return out[-1]

    def rejoin(self, node: DataServer) -> None:
        """Start a killed data server again as a replica of the current master (from the thread
        that started the set); :meth:`wait_ready` with that master then waits until it is in sync and
        every Sentinel sees it up (so it can be promoted in turn)."""
        master = self.master()
        node.replicaof = (master.host, master.port)
        node.restart(save=False, wait=False)

    def stop(self) -> None:
        for server in [*self.sentinels, *self.nodes]:
            server.stop()
        self.sentinels, self.nodes = [], []

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
