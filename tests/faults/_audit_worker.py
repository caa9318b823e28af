"""A consumer process that writes every handler run to an audit stream: ``python _audit_worker.py URL SERVICE
CONSUMER TTL``.

It runs ``client.run(handler)`` (recovery on, as every consumer of a fleet). The handler XADDs
``start`` (name, consumer, token, registration) to ``<SERVICE>-audit``, works 10-60 ms and XADDs
``end``; on a registration whose Info says ``{"kill": true}`` it claims the kill (SET NX on its
registration, so each kills one process however often it comes back), XADDs ``dying`` and dies
(``os._exit(3)``: no clean-up, its locks left to expire). Every audit write goes over one connection,
so the server orders them as this process sent them: nothing it started comes after its ``dying``.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys

import redis.asyncio as aioredis

import lbs


async def main(url: str, service: str, consumer: str, ttl: float) -> None:
    audit = aioredis.Redis(
        connection_pool=aioredis.BlockingConnectionPool.from_url(url, max_connections=1)
    )
    key = f"{service}-audit"

    async def handle(note: lbs.Notification) -> None:
        info = note.info or {}
        if info.get("kill") and await audit.set(f"{key}:killed:{info['reg']}", consumer, nx=True):
            await audit.xadd(key, {"ev": "dying", "consumer": consumer})
            os._exit(3)
        fields = {
            "name": note.stream,
            "consumer": consumer,
            "token": note.token,
            "reg": str(info.get("reg")),
        }
        await audit.xadd(key, {"ev": "start", **fields})
        await asyncio.sleep(random.uniform(0.01, 0.06))
        await audit.xadd(key, {"ev": "end", **fields})

    cfg = lbs.Config(lock_ttl=ttl, read_block=0.1)
    client = lbs.Client(
        url, service, consumer_id=consumer, config=cfg, load_entrypoint_plugins=False
    )
    await client.run(handle)


if __name__ == "__main__":
    url, service, consumer, ttl = sys.argv[1:5]
    asyncio.run(main(url, service, consumer, float(ttl)))
