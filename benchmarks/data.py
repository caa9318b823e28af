"""Shared inputs for the benchmarks, so every side of a comparison gets the same data."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis

_counter = itertools.count()


def service_name(tag: str) -> str:
    """A service name no other round or run shares (keys are never flushed)."""
    return f"bench-{tag}-{next(_counter)}-{uuid.uuid4().hex[:6]}"


async def cleanup(r: aioredis.Redis, service: str) -> None:
    """Delete every key of ``service``."""
    keys = [k async for k in r.scan_iter(match=f"*{service}*", count=10_000)]
    for i in range(0, len(keys), 10_000):
        await r.unlink(*keys[i : i + 10_000])


async def cleanup_node(r: aioredis.Redis, service: str) -> None:
    """Delete every key of ``service`` on one node of a cluster (each key alone: they live in
    several slots)."""
    keys = [k async for k in r.scan_iter(match=f"*{service}*", count=10_000)]
    for i in range(0, len(keys), 1_000):
        pipe = r.pipeline(transaction=False)
        for k in keys[i : i + 1_000]:
            pipe.unlink(k)
        await pipe.execute()


def stream_specs(n: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"session-{i}", {"user": f"u{i}", "shard": i % 7, "tags": ["a", "b"]}) for i in range(n)
    ]


def xadd_commands(service: str, n: int) -> list[tuple[Any, ...]]:
    from lbs import encode_input, input_stream

    return [
        ("XADD", input_stream(service), "*", "lbs-input", encode_input(name, info))
        for name, info in stream_specs(n)
    ]


async def steady(
    publish: Callable[[list[tuple[str, dict[str, Any]]]], Awaitable[Any]],
    rate: float,
    seconds: float,
    tick: float = 0.005,
) -> int:
    """Publish ``rate`` registrations a second for ``seconds``, in ticks of ``tick`` (5 ms): each tick sends
    what is due as one batch of ``(name, {"t": <time.perf_counter() at sending>})``, names ``s<i>`` (each
    once). Returns how many were published."""
    loop = asyncio.get_running_loop()
    start, sent = loop.time(), 0
    total = int(rate * seconds)
    while sent < total:
        due = min(total, int((loop.time() - start) * rate) + 1)
        if due > sent:
            now = repr(time.perf_counter())
            await publish([(f"s{i}", {"t": now}) for i in range(sent, due)])
            sent = due
        await asyncio.sleep(tick)
    return sent
