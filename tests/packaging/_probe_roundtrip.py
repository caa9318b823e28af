"""Run by an installed lbs, never the tree: a producer registers COUNT streams and a consumer
takes and finishes every one. Prints, as JSON, where lbs and its core came from and which
installed plugins (entry points) the client loaded.

Usage: python -I _probe_roundtrip.py REDIS_URL SERVICE COUNT
"""

from __future__ import annotations

import asyncio
import json
import sys

import _lbscore._core
import lbs


async def main(url: str, service: str, count: int) -> None:
    names = [f"{service}-{i}" for i in range(count)]
    async with lbs.Producer(url, service) as producer:
        await producer.add_streams(names)
    seen: list[str] = []

    async def handle(note: lbs.Notification) -> None:
        seen.append(note.stream)

    client = lbs.Client(url, service, consumer_id="wheel-probe")
    runner = asyncio.create_task(client.run(handle, concurrency=8, handle_signals=False))
    try:
        await client.wait_finished(count, timeout=120)
    finally:
        await client.close()
        await runner
    print(
        json.dumps(
            {
                "lbs": lbs.__file__,
                "core": _lbscore._core.__file__,
                "version": lbs.__version__,
                "seen": sorted(seen),
                "done": client.stats.done,
                "plugins": sorted(
                    dist.project_name for _, dist in client.pm.list_plugin_distinfo()
                ),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
