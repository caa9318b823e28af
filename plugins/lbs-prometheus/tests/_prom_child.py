"""Run as a subprocess by test_prometheus_entrypoint.py: a client with entry-point
plugins on (as an application gets them), one stream worked, then a report.

argv: redis url, service. Prints one JSON line, then waits for a line on stdin
before closing (so the parent can scrape the process-wide server).
"""

from __future__ import annotations

import asyncio
import json
import sys

from _prom_helpers import listening_ports, produce, take
from prometheus_client import REGISTRY

import lbs
import lbs_prometheus


async def main(url: str, service: str) -> None:
    client = lbs.Client(url, service, consumer_id="ep", config=lbs.Config(read_block=0.1))
    loaded = client.pm.get_plugin("prometheus")
    await client.start()
    try:
        await produce(url, service, "ep-stream")
        (note,) = await take(client, 1)
        await client.done_stream(note.stream)
        labels = {"service": service, "consumer": client.id}
        report = {
            "loaded": loaded is lbs_prometheus.default_plugin,
            "consumer": client.id,
            "port": lbs_prometheus.default_plugin.port,
            "listening": sorted(listening_ports()),
            "acquired": REGISTRY.get_sample_value("lbs_locks_acquired_total", labels),
            "released": REGISTRY.get_sample_value(
                "lbs_locks_released_total", {**labels, "status": "DONE"}
            ),
        }
        print(json.dumps(report), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    finally:
        await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
