"""A consumer process that a test kills with SIGKILL: ``python _read_kill_worker.py URL SERVICE CONSUMER TTL``.

It runs ``client.run(handler)`` with ``Config(lock_ttl=TTL, read_block=0.2)``; the handler records
each run in Redis (``RPUSH <SERVICE>:runs`` then, after a random pause of up to 300 ms,
``RPUSH <SERVICE>:ends``, each ``[stream, token, consumer]``), so a kill lands anywhere in the read
loop: waiting in the wake group, reading and locking, handing out, in a handler, finishing.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys

import redis.asyncio as aioredis

import lbs


async def main(url: str, service: str, consumer: str, ttl: float) -> None:
    r = aioredis.from_url(url)
    rng = random.Random(os.getpid())

    async def handle(note: lbs.Notification) -> None:
        run = json.dumps([note.stream, note.token, consumer])
        await r.rpush(f"{service}:runs", run)
        await asyncio.sleep(rng.random() * 0.3)
        await r.rpush(f"{service}:ends", run)

    cfg = lbs.Config(lock_ttl=ttl, read_block=0.2)
    client = lbs.Client(
        url, service, consumer_id=consumer, config=cfg, load_entrypoint_plugins=False
    )
    await client.run(handle)


if __name__ == "__main__":
    url, service, consumer, ttl = sys.argv[1:5]
    asyncio.run(main(url, service, consumer, float(ttl)))
