"""A consumer process that a poison pill kills: ``python _crash_worker.py URL SERVICE CONSUMER TTL MODE HOLD``.

MODE ``queue``: a first client (the notification API) holds HOLD streams of SERVICE (read, queued for
the application, never taken) and the process prints ``{"held": HOLD}``; then a second client runs
``client.run(handler, concurrency=1)`` on the service ``SERVICE-poison`` (so that which stream it
gets never depends on the order recovery put them back in).
MODE ``run``: only the second client, with ``concurrency=HOLD``.
The handler prints ``{"running": stream}`` and kills the process (``os._exit(3)``, no clean-up) on a
stream named ``poison*``; the others work until the process dies.
Its own recovery is off: the test recovers, as another consumer of the fleet would.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import lbs


async def main(url: str, service: str, consumer: str, ttl: float, mode: str, hold: int) -> None:
    async def handle(note: lbs.Notification) -> None:
        print(json.dumps({"running": note.stream}), flush=True)
        if note.stream.startswith("poison"):
            os._exit(3)
        await asyncio.sleep(3600)

    if mode == "queue":
        cfg = lbs.Config(
            lock_ttl=ttl,
            read_block=0.1,
            recovery=False,
            max_streams=hold,
            notification_buffer=hold + 16,
        )
        holder = lbs.Client(
            url, service, consumer_id=consumer + "-queue", config=cfg, load_entrypoint_plugins=False
        )
        await holder.start()
        while holder.held < hold:
            await asyncio.sleep(0.05)
        print(json.dumps({"held": holder.held}), flush=True)
        hold, service = 1, service + "-poison"
    cfg = lbs.Config(lock_ttl=ttl, read_block=0.1, recovery=False)
    runner = lbs.Client(
        url, service, consumer_id=consumer, config=cfg, load_entrypoint_plugins=False
    )
    await runner.run(handle, concurrency=hold)


if __name__ == "__main__":
    url, service, consumer, ttl, mode, hold = sys.argv[1:7]
    asyncio.run(main(url, service, consumer, float(ttl), mode, int(hold)))
