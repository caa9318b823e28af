"""The audited handler of the deploy and frozen-consumer tests, for ``lbs worker _deploy_handler:handle``
(run with this folder on PYTHONPATH; ``LBS_URL`` and ``LBS_SERVICE`` set): every run of a data stream
(``handle_keyed``: of a key's batch, ``--keyed``) is written to the audit stream ``<service>-audit``. ``python _deploy_handler.py CONSUMER TTL`` runs the same
work through the notification API (``async with note:``) instead of ``run()``.

Each run XADDs ``start`` (name, worker, pid, token, entry) when it begins, then works for the
registration's ``Info["work"]`` seconds and XADDs ``end``; a run that is cancelled (drained too long,
disowned) XADDs ``cancelled`` before it lets the cancellation go. The writes are synchronous (a
blocking redis-py client, one connection per process): none can be cut by a cancellation, and each
is in Redis before the handler returns, so before lbs finishes or hands back its stream. The audit
stream's order is therefore the order of the runs' starts and ends across every process.
"""

from __future__ import annotations

import asyncio
import os

import redis

import lbs

_AUDIT = redis.Redis.from_url(os.environ["LBS_URL"])
_KEY = f"{os.environ['LBS_SERVICE']}-audit"
_WORKER = os.environ.get("DEPLOY_WORKER", "?")
_PID = str(os.getpid())


async def _run(name: str, token: int, entry: str, retry: int, work: float) -> None:
    fields = {
        "name": name,
        "worker": _WORKER,
        "pid": _PID,
        "token": str(token),
        "entry": entry,
        "retry": str(retry),
    }
    _AUDIT.xadd(_KEY, {"ev": "start", **fields})
    try:
        await asyncio.sleep(work)
    except asyncio.CancelledError:
        _AUDIT.xadd(_KEY, {"ev": "cancelled", **fields})
        raise
    _AUDIT.xadd(_KEY, {"ev": "end", **fields})


async def handle(note: lbs.Notification) -> None:
    work = float((note.info or {}).get("work", 0.02))
    await _run(note.stream, note.token, note.entry_id, note.retry_count, work)


async def handle_keyed(batch: lbs.KeyedBatch) -> None:
    """``run_keyed()``: one run per batch, named after its key; it works for the sum of its messages'
    ``work`` fields."""
    work = sum(float(m.fields.get("work", 0.02)) for m in batch.messages)
    await _run(batch.key, batch.token, batch.entry_id, batch.retry_count, work)


async def _notes(consumer: str, ttl: float) -> None:
    """The notification API's loop: each STREAM_ADDED worked on in its ``async with`` block."""
    cfg = lbs.Config(lock_ttl=ttl, read_block=30.0)
    client = lbs.Client(
        os.environ["LBS_URL"],
        os.environ["LBS_SERVICE"],
        consumer_id=consumer,
        config=cfg,
        load_entrypoint_plugins=False,
    )
    await client.start()
    print("started on", flush=True)
    try:
        async for note in client.notifications():
            if note.type is lbs.NotificationType.STREAM_ADDED:
                async with note:
                    await handle(note)
    finally:
        await client.close()


if __name__ == "__main__":
    import sys

    asyncio.run(_notes(sys.argv[1], float(sys.argv[2])))
