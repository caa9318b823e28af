"""A keyed consumer process whose handler hangs on one message: ``python _keyed_worker.py URL SERVICE CONSUMER TTL OUT``.

It runs ``client.run_keyed(handler, batch=10)`` with its own recovery on (so it re-queues, then
takes, the key of a holder that was killed before it). The handler prints ``{"running": n, "id": ..., "token": ...,
"retry_count": ...}`` for each message it starts (field ``n``), hangs on the message whose ``n`` is 0
(the test kills the process there with ``kill -9``) and emits every other one to the stream OUT, an
effect written with the commit that moves the key past the message.
"""

from __future__ import annotations

import asyncio
import json
import sys

import lbs


async def main(url: str, service: str, consumer: str, ttl: float, out: str) -> None:
    async def handle(batch: lbs.KeyedBatch) -> None:
        for m in batch.messages:
            n = m.fields["n"]
            line = {
                "running": n,
                "id": m.id,
                "token": batch.token,
                "retry_count": batch.retry_count,
            }
            print(json.dumps(line), flush=True)
            if n == "0":
                await asyncio.sleep(3600)  # hangs: the test kills the process here
            batch.emit(out, {"n": n, "id": m.id, "consumer": consumer}, m)

    cfg = lbs.Config(lock_ttl=ttl, read_block=0.1, deadline_poll_interval=0.05, retry_delay=0.1)
    client = lbs.Client(
        url, service, consumer_id=consumer, config=cfg, load_entrypoint_plugins=False
    )
    await client.run_keyed(handle, batch=10)


if __name__ == "__main__":
    url, service, consumer, ttl, out = sys.argv[1:6]
    asyncio.run(main(url, service, consumer, float(ttl), out))
