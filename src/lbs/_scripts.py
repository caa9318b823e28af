"""The Lua scripts in ``scripts/``, registered on a client.

Each file is ``<name>-<number of keys>.lua`` (``n`` for a variable count) and
opens with a header documenting KEYS, ARGV and outputs. redis-py's Script
objects run them with EVALSHA and reload them after a NOSCRIPT (a restart or
a failover), also inside pipelines.
"""

from __future__ import annotations

import enum
from functools import lru_cache
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

SCRIPT_NAMES = ("read-3", "extend-n", "done-n", "requeue-3", "reap-3", "leave-1")


@lru_cache(maxsize=None)
def source(name: str) -> str:
    return resources.files("lbs").joinpath("scripts").joinpath(f"{name}.lua").read_text()


class Scripts:
    """The scripts, registered on one client."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.read: Any = redis.register_script(source("read-3"))
        self.extend: Any = redis.register_script(source("extend-n"))
        self.done: Any = redis.register_script(source("done-n"))
        self.requeue: Any = redis.register_script(source("requeue-3"))
        self.reap: Any = redis.register_script(source("reap-3"))
        self.leave: Any = redis.register_script(source("leave-1"))

    def sources(self) -> list[str]:
        """Every script's Lua source (what a NOSCRIPT reloads)."""
        return [source(name) for name in SCRIPT_NAMES]


class DoneCode(enum.IntEnum):
    """Per-entry outputs of ``done-n.lua``."""

    DONE = 1
    LOCK_EXPIRED = 2
    LOCK_LOST = 3
    #: A retried call (its first reply was lost) found the entry already finished.
    ALREADY_DONE = 4


class RequeueCode(enum.IntEnum):
    """First element of the output of ``requeue-3.lua``."""

    #: A key had the wrong type (the detail names it): nothing was touched.
    REFUSED = -2
    TRIMMED = -1
    SKIPPED = 0
    REQUEUED = 1
    DEAD_LETTERED = 2
    DROPPED = 3
