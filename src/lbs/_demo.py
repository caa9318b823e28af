"""The demo behind ``python -m lbs demo``: one producer, two consumers, one embedded Redis.

It registers a few data streams (each with some events of its own), lets two
consumers in the service's group take them round-robin, each under its
assignment's lock, and finishes each one by releasing the lock and acking and
deleting the LBS entry in one round trip. It then checks that nothing is
left: no pending entries, no LBS entries, no locks.

The consumer loop here is deliberately small; the full client (heartbeats,
recovery, hand-back) is :class:`lbs.Client` in later releases.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from _lbscore import try_decode_input

from . import _keys
from .producer import Producer

Printer = Callable[[str], None]


@dataclass
class DemoResult:
    registered: int = 0
    processed: Counter[str] = field(default_factory=Counter)
    invalid: int = 0
    leftover_pending: int = -1
    leftover_entries: int = -1
    leftover_locks: int = -1

    @property
    def ok(self) -> bool:
        return (
            sum(self.processed.values()) == self.registered
            and self.leftover_pending == 0
            and self.leftover_entries == 0
            and self.leftover_locks == 0
        )


async def _consume(
    r: aioredis.Redis, service: str, consumer: str, result: DemoResult,
    all_done: asyncio.Event, out: Printer,
) -> None:
    stream, group = _keys.input_stream(service), _keys.group_name(service)
    while not all_done.is_set():
        reply = await r.xreadgroup(group, consumer, {stream: ">"}, count=1, block=100)
        for raw_id, fields in _entries(reply):
            entry_id = raw_id.decode()
            name, info, reason = try_decode_input(fields.get(_keys.INPUT_FIELD.encode()))
            if name is None:
                result.invalid += 1
                out(f"{consumer}: entry {entry_id} is not a valid assignment ({reason})")
                continue
            lock = _keys.lock_key(service, entry_id)
            if not await r.set(lock, consumer, nx=True, px=10_000):
                out(f"{consumer}: {name} is locked by someone else, skipping")
                continue
            events: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(name)  # type: ignore[assignment]
            total = sum(int(f[b"value"]) for _, f in events)
            await asyncio.sleep(0.02)  # the application's work
            # Done: release the lock, ack and delete the assignment, in one round trip.
            pipe = r.pipeline(transaction=True)
            pipe.delete(lock)
            pipe.xack(stream, group, entry_id)
            pipe.xdel(stream, entry_id)
            await pipe.execute()
            result.processed[consumer] += 1
            out(f"{consumer}: {name} (entry {entry_id}, info {info}) -> "
                f"{len(events)} events, sum {total}; lock released, entry acked and deleted")
            if sum(result.processed.values()) + result.invalid >= result.registered:
                all_done.set()


def _entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """The (id, fields) pairs of an XREADGROUP reply.

    redis-py gives ``[[stream, entries]]`` under RESP2 and
    ``{stream: [entries]}`` under RESP3.
    """
    if not reply:
        return []
    if isinstance(reply, dict):
        return [e for wrapped in reply.values() for entries in wrapped for e in entries]
    return [e for _, entries in reply for e in entries]


async def run_demo(
    url: str, *, service: str = "demo", streams: int = 6, consumers: int = 2,
    events: int = 3, out: Printer = print,
) -> DemoResult:
    """Run the demo against the Redis at ``url``; return what happened."""
    result = DemoResult()
    r = aioredis.Redis.from_url(url)
    try:
        stream, group = _keys.input_stream(service), _keys.group_name(service)
        try:
            await r.xgroup_create(stream, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # The data streams themselves: some events each, for the consumers to read.
        names = [f"session-{i + 1}" for i in range(streams)]
        pipe = r.pipeline(transaction=False)
        for n, name in enumerate(names):
            for e in range(events):
                pipe.xadd(name, {"value": n * 10 + e})
        await pipe.execute()

        started = time.perf_counter()
        async with Producer(r, service) as producer:
            ids = await producer.add_streams((name, {"user": f"u{i}"}) for i, name in enumerate(names))
        result.registered = len(ids)
        out(f"producer: registered {len(ids)} data streams in {stream} in one round trip")

        all_done = asyncio.Event()
        if not ids:
            all_done.set()
        workers = [
            asyncio.create_task(_consume(r, service, f"consumer-{chr(97 + c)}", result, all_done, out))
            for c in range(consumers)
        ]
        try:
            await asyncio.wait_for(all_done.wait(), timeout=30)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        elapsed = time.perf_counter() - started

        result.leftover_pending = (await r.xpending(stream, group))["pending"]
        result.leftover_entries = await r.xlen(stream)
        result.leftover_locks = len([k async for k in r.scan_iter(match=_keys.lock_key(service, "*"))])
        per = ", ".join(f"{c} {n}" for c, n in sorted(result.processed.items()))
        out(f"done in {elapsed:.2f}s: {sum(result.processed.values())}/{result.registered} data streams "
            f"processed ({per}); left behind: {result.leftover_pending} pending, "
            f"{result.leftover_entries} LBS entries, {result.leftover_locks} locks")
        await r.delete(*names)
    finally:
        await r.aclose()
    return result
