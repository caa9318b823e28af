"""A consumer process for the SIGTERM test: ``python _sigterm_worker.py URL SERVICE CONSUMER TTL DRAIN [CONCURRENCY]``.

It runs ``client.run(handler)`` the README's way (``try: run() finally:
close()``) and installs no signal handler of its own: what SIGTERM does is
up to lbs. The handler prints one JSON line per stream it takes
(``{"stream", "token", "retry_count"}``) and then works on it for an hour
(until cancelled). When ``run()`` returns it prints ``{"exit": ...}`` and
exits 0.
"""

from __future__ import annotations

import asyncio
import json
import sys

import lbs


async def main(
    url: str, service: str, consumer: str, ttl: float, drain: float, concurrency: int
) -> None:
    cfg = lbs.Config(lock_ttl=ttl, read_block=0.1, deadline_poll_interval=0.05, drain_timeout=drain)
    client = lbs.Client(
        url, service, consumer_id=consumer, config=cfg, load_entrypoint_plugins=False
    )

    async def handle(note: lbs.Notification) -> None:
        print(
            json.dumps(
                {"stream": note.stream, "token": note.token, "retry_count": note.retry_count}
            ),
            flush=True,
        )
        await asyncio.sleep(3600)

    try:
        await client.run(handle, concurrency=concurrency)
    finally:
        await client.close()
    print(json.dumps({"exit": "run() returned"}), flush=True)


if __name__ == "__main__":
    url, service, consumer = sys.argv[1], sys.argv[2], sys.argv[3]
    concurrency = int(sys.argv[6]) if len(sys.argv) > 6 else 20
    asyncio.run(main(url, service, consumer, float(sys.argv[4]), float(sys.argv[5]), concurrency))
