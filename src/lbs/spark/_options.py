"""Options of the ``lbs`` data source: parsing, validation, and the Redis connection they describe.

Spark hands options over as strings with lowercased keys; every reader and
writer parses them here, into frozen dataclasses that pickle to executors.
Connections are opened from those settings inside ``read()`` / ``write()``
/ ``commit()``, never pickled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from .._redis.connection import cluster_url, parse_version
from .._redis.errors import reply_error
from .._redis.sentinel import is_sentinel_url, parse_sentinel_url, sentinel_client_sync
from .._urlmask import mask_url
from ..exceptions import ConfigurationError

#: Options passed to redis-py as they are (TLS files and checks).
_SSL_OPTIONS = (
    "ssl_ca_certs",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
)


def lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def flag(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ConfigurationError(f"option {name!r} must be true or false, got {raw!r}")


def number(opts: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigurationError(f"option {name!r} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class Connection:
    """Where Redis is, the way :class:`lbs.Client` takes it.

    Option ``url`` (``redis://``, ``rediss://`` for TLS, ``redis+cluster://``
    or ``rediss+cluster://`` for Redis Cluster, ``redis+sentinel://`` or
    ``rediss+sentinel://`` for the master a set of Sentinels names), ``cluster`` (``none``, the
    default, or ``oss``), ``username`` / ``password`` (override the URL's,
    and keep secrets out of it), and redis-py's TLS settings ``ssl_ca_certs``,
    ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``, ``ssl_check_hostname``.
    """

    url: str
    cluster: bool = False
    username: str | None = None
    password: str | None = None
    ssl: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, opts: Mapping[str, str], what: str = "the lbs source") -> Connection:
        url = opts.get("url")
        if not url:
            raise ConfigurationError(
                f"{what} needs option 'url' (redis://host:port, rediss://, redis+cluster://, "
                "redis+sentinel://)"
            )
        if is_sentinel_url(url):
            parse_sentinel_url(url)  # a URL that does not fit fails here, on the driver
            if (opts.get("cluster") or "none").lower() in ("oss", "true"):
                raise ConfigurationError("a redis+sentinel:// URL names one master, not a cluster")
        url, cluster = cluster_url(url)
        mode = (opts.get("cluster") or "none").lower()
        if mode not in ("none", "oss", "true", "false"):
            raise ConfigurationError(
                f"option 'cluster' must be 'none' or 'oss', got {opts['cluster']!r}"
            )
        cluster = cluster or mode in ("oss", "true")
        ssl = tuple((k, opts[k]) for k in _SSL_OPTIONS if opts.get(k))
        return cls(
            url=url,
            cluster=cluster,
            username=opts.get("username") or None,
            password=opts.get("password") or None,
            ssl=ssl,
        )

    def _kwargs(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.username:
            kw["username"] = self.username
        if self.password:
            kw["password"] = self.password
        for k, v in self.ssl:
            kw[k] = v.lower() in ("true", "1", "yes") if k == "ssl_check_hostname" else v
        return kw

    def client(self) -> redis.Redis | RedisCluster:
        """A new synchronous client (the caller closes it)."""
        if self.cluster:
            return RedisCluster.from_url(self.url, **self._kwargs())
        if is_sentinel_url(self.url):
            return sentinel_client_sync(self.url, **self._kwargs())
        return redis.Redis.from_url(self.url, **self._kwargs())

    def __repr__(self) -> str:  # never print a password into a Spark plan or log
        return f"Connection(url={mask_url(self.url)!r}, cluster={self.cluster})"


def node_of(client: Any, key: str) -> tuple[str, redis.Redis]:
    """The name and a plain client of the node that owns ``key`` (the client itself off a cluster)."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return node.name, node.redis_connection
    return "", client


class RawConnection:
    """One pooled redis-py connection used raw: lbs sends the bytes and the core's RespReader reads the replies.

    redis-py still opens it (TLS, AUTH, the RESP handshake). ``close(ok=False)``
    drops it, since a reply may be half read.
    """

    def __init__(self, client: redis.Redis) -> None:
        from _lbscore import RespReader

        self.pool = client.connection_pool
        self.conn: Any = self.pool.get_connection()
        self.reader = RespReader(reply_error)

    def send(self, data: bytes) -> None:
        self.conn._sock.sendall(data)

    def send_command(self, *args: Any) -> None:
        self.conn.send_command(*args)

    def receive(self) -> None:
        """Feed the reader what has arrived (waiting for at least one byte)."""
        chunk = self.conn._sock.recv(1 << 20)
        if not chunk:
            raise redis.ConnectionError("the connection closed in the middle of a reply")
        self.reader.feed(chunk)

    def close(self, ok: bool) -> None:
        if not ok:
            self.conn.disconnect()
        self.pool.release(self.conn)


def server_version(r: Any) -> tuple[int, ...]:
    """The lowest server version behind ``r`` (every master on a cluster)."""
    try:
        info = r.info("server")
    except redis.RedisError:
        return ()
    if isinstance(info, dict) and "redis_version" not in info:  # a cluster: one reply per node
        versions = [
            parse_version(v.get("redis_version", "0")) for v in info.values() if isinstance(v, dict)
        ]
        return min(versions) if versions else ()
    return parse_version(info.get("redis_version", "0"))
