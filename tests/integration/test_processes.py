"""Consumers as separate processes, where the process boundary is the point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs

from _helpers import eventually, next_line

pytestmark = pytest.mark.timeout(120)

# A consumer process: prints every notification as a JSON line; after a
# STREAM_DISOWNED it calls done_stream for that stream and prints the status.
CONSUMER = textwrap.dedent(
    """
    import asyncio, json, sys
    import lbs

    async def main(url, service, ttl):
        c = lbs.Client(url, service, consumer_id="stalled",
                       config=lbs.Config(lock_ttl=ttl, read_block=0.1, recovery=False),
                       load_entrypoint_plugins=False)
        await c.start()
        async for note in c.notifications():
            print(json.dumps({"type": note.type.name, "stream": note.stream, "token": note.token}), flush=True)
            if note.type is lbs.NotificationType.STREAM_DISOWNED:
                status = await c.done_stream(note.stream)
                print(json.dumps({"type": "DONE", "status": status.name}), flush=True)
                break
        await c.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
    """
)


async def test_stalled_process_is_disowned_and_its_done_reports_the_lost_lease(
    any_server: Any, service: str, rr: aioredis.Redis
) -> None:
    ttl = 0.5
    r = rr  # closed by the fixture, even when an assertion fails
    await lbs.Producer(r, service).add_stream("slow")
    with subprocess.Popen(
        [sys.executable, "-c", CONSUMER, any_server.url, service, str(ttl)],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            added = await next_line(proc, timeout=15)
            assert added["type"] == "STREAM_ADDED" and added["stream"] == "slow"
            ((entry_id, holder),) = [
                (p["message_id"].decode(), p["consumer"].decode())
                for p in await r.xpending_range(
                    lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
                )
            ]
            lease = lbs.lease_key(service, holder)
            assert await r.exists(lease) == 1
            os.kill(proc.pid, signal.SIGSTOP)  # stalls past the TTL: no heartbeat

            async def lease_gone() -> bool:
                return await r.exists(lease) == 0  # reading an expired key deletes it

            await eventually(lease_gone, timeout=ttl * 20)
            os.kill(proc.pid, signal.SIGCONT)
            disowned = await next_line(proc, timeout=15)
            assert disowned == {
                "type": "STREAM_DISOWNED",
                "stream": "slow",
                "token": added["token"],
            }
            done = await next_line(proc, timeout=15)
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
    # The heartbeat that found the lease gone takes it again and re-queues the
    # entry (recovery is off: nobody else would have), racing the application's
    # done_stream; exactly one of them wins, and the status says which.
    left = await r.xrange(lbs.input_stream(service))
    if done == {"type": "DONE", "status": "DONE"}:
        # done won, under the lease taken again, with the entry still pending to this
        # consumer (nobody took it meanwhile): acked, nobody else processed it
        assert left == []
    else:
        # done lost: sent while the lease was gone, or after the re-queue
        assert done == {"type": "DONE", "status": "LOCK_LOST"}
        ((new_id, fields),) = left  # the re-queue won: back in circulation, no retry counted
        assert new_id.decode() != entry_id  # (losing a lease is not the stream's failure)
        assert fields[b"_retry_count"] == b"0" and fields[b"_original_id"] == entry_id.encode()
    assert (await r.xpending(lbs.input_stream(service), lbs.group_name(service)))["pending"] == 0
