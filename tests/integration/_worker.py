"""A consumer process for the recovery tests: ``python _worker.py URL SERVICE CONSUMER TTL [WORK] [FLAGS]``.

It runs ``lbs.Client.run`` with a handler that sleeps WORK seconds and
records each attempt in the stream ``audit:<service>`` (stream, consumer,
token, start, end, status): status CALLING just before ``done_stream``, then
a second record with its result, and prints one JSON line per
STREAM_ADDED (``{"stream", "token", "entry_id"}``) so the test can wait for it.
FLAGS: ``poison`` makes it die (``os._exit``) on any stream named
``poison*``; ``norecovery`` turns its own recovery off.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

import lbs


async def main(
    url: str, service: str, consumer: str, ttl: float, work: float, flags: set[str]
) -> None:
    # A redis+cluster:// URL (the cluster latency benchmark) gets a cluster client for the audit stream.
    r: Any = (
        RedisCluster.from_url("redis://" + url[len("redis+cluster://") :])
        if url.startswith("redis+cluster://")
        else aioredis.Redis.from_url(url)
    )
    # An entry delivered to a worker killed before it took the lock has no lock
    # and no deadline: only the scan recovers it. The chaos test's workers
    # rarely live the default 60 s between scans, so they scan every second.
    cfg = lbs.Config(
        lock_ttl=ttl,
        read_block=0.1,
        deadline_poll_interval=0.05,
        max_streams=20,
        recovery="norecovery" not in flags,
        min_idle=3 * ttl,
        reconciliation_interval=1.0,
    )
    client = lbs.Client(
        url if isinstance(r, RedisCluster) else r,
        service,
        consumer_id=consumer,
        config=cfg,
        load_entrypoint_plugins=False,
    )

    async def handle(note: lbs.Notification) -> None:
        print(
            json.dumps({"stream": note.stream, "token": note.token, "entry_id": note.entry_id}),
            flush=True,
        )
        if "poison" in flags and note.stream.startswith("poison"):
            os._exit(3)  # dies on it, every time
        start = time.time()
        await asyncio.sleep(work)
        # Two records per attempt: one before done_stream, one with its
        # result. A kill -9 between done_stream and the second record leaves
        # only the first, so the test can tell "finished, outcome unknown"
        # from "never finished".
        record = {"stream": note.stream, "consumer": consumer, "token": note.token, "start": start}
        await r.xadd(f"audit:{service}", {**record, "end": time.time(), "status": "CALLING"})
        status = await client.done_stream(note.stream, note.entry_id)
        await r.xadd(f"audit:{service}", {**record, "end": time.time(), "status": status.name})

    await client.start()

    # Like client.run(), but the handler finishes the stream itself, so the
    # audit entry can carry what done_stream found.
    async def run() -> None:
        limit = asyncio.Semaphore(20)
        running: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

        async def one(note: lbs.Notification) -> None:
            try:
                await handle(note)
            finally:
                limit.release()

        async for note in client.notifications():
            if note.type is lbs.NotificationType.STREAM_ADDED:
                await limit.acquire()
                task = asyncio.create_task(one(note))
                running.add(task)
                task.add_done_callback(running.discard)

    await run()


if __name__ == "__main__":
    url, service, consumer, ttl = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    work = float(sys.argv[5]) if len(sys.argv) > 5 else 3600.0
    flags = set(sys.argv[6].split(",")) if len(sys.argv) > 6 and sys.argv[6] else set()
    asyncio.run(main(url, service, consumer, ttl, work, flags))
