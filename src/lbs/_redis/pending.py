"""The group's pending list read a page at a time (``XPENDING`` extended form, an exclusive cursor).

Callers: recovery's scan and start (:mod:`lbs._consumer.recovery`), and the heartbeat's look at
what is pending to its own consumer (:mod:`lbs._consumer.heartbeat`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from .wire import text

__all__ = ["pages"]


async def pages(
    redis: aioredis.Redis,
    stream: str,
    group: str,
    size: int,
    *,
    idle_ms: int | None = None,
    consumer: str | None = None,
) -> AsyncIterator[list[dict[str, Any]]]:
    """The pending list of ``group`` on ``stream`` (or ``consumer``'s part of it, or the entries idle at
    least ``idle_ms``), ``size`` entries a page, as redis-py's ``xpending_range`` gives them. Redis's
    errors (NOGROUP: no group) are raised."""
    cursor = "-"
    while True:
        page = await redis.xpending_range(
            stream, group, min=cursor, max="+", count=size, idle=idle_ms, consumername=consumer
        )
        if not page:
            return
        yield page
        if len(page) < size:
            return
        cursor = "(" + text(page[-1]["message_id"])
