"""A throwaway Redis Cluster (:class:`RedisClusterServers`): masters and replicas on free ports."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import redis

from ..exceptions import ConfigurationError, ServerStartError
from .binaries import find_redis_server
from .server import RedisServer


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
            m = self.masters_count
            for i, c in enumerate(clients[:m]):  # equal ranges: [i x 16384 // m, (i + 1) x ...)
                first, last = i * self.SLOTS // m, (i + 1) * self.SLOTS // m - 1
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
