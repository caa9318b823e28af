"""kill -9 of consumers anywhere in the read loop, under steady traffic: nothing is lost, a
re-run always carries a greater fencing token, and a killed consumer's work is back within the
lock TTL + 1 s.

The read loop reads with a plain XREADGROUP (blocking in Redis once the group is drained) and takes
the batch with one MULTI; what it read is pending to it and held by its lease from the moment it is
delivered, so there is no moment at which an entry is delivered and held by nobody; this kills worker processes (``_audit_worker.py``: each run's start and end in an audit stream, 10-60
ms of work between) at random moments of a steady feed (waiting, reading, in a handler, finishing)
and checks what a user relies on. A consumer in this process
(recovery on, as every lbs consumer has it) survives and takes the work back.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
import redis.asyncio as aioredis

import lbs

from _fleet import FULL, HERE, SCALE, TEST_TIMEOUT, eventually, server

TTL = 1.0
#: Streams fed at RATE a second while workers are killed every 0.2-0.6 s.
STREAMS, RATE = 300 * SCALE, 100

# On Valkey too in make test (tests/faults/conftest.py): a fault whose handling depends on the server.
pytestmark = [pytest.mark.timeout(TEST_TIMEOUT), pytest.mark.valkey_smoke]


def spawn(url: str, service: str, consumer: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "_audit_worker.py"), url, service, consumer, str(TTL)],
        stdout=subprocess.DEVNULL,
    )


async def test_kill_9_anywhere_in_the_read_loop_loses_nothing() -> None:
    rng = random.Random(32)
    service = "readkill"
    with server() as srv:
        r = aioredis.from_url(srv.url)

        audit = f"{service}-audit"  # what _audit_worker.py writes: a start and an end per run

        async def handle(note: lbs.Notification) -> None:
            fields = {"name": note.stream, "consumer": "survivor", "token": note.token}
            await r.xadd(audit, {"ev": "start", **fields})
            await r.xadd(audit, {"ev": "end", **fields})

        cfg = lbs.Config(lock_ttl=TTL, read_block=0.2)
        survivor = lbs.Client(srv.url, service, "survivor", cfg, load_entrypoint_plugins=False)
        serving = asyncio.create_task(survivor.run(handle))
        workers = {f"w{i}": spawn(srv.url, service, f"w{i}") for i in range(2)}
        names = [f"s{i}" for i in range(STREAMS)]

        async def feed() -> None:
            async with lbs.Producer(srv.url, service) as producer:
                for i in range(0, STREAMS, 10):
                    await producer.add_streams(names[i : i + 10])
                    await asyncio.sleep(10 / RATE)

        feeding = asyncio.create_task(feed())
        kills = 0
        try:
            while not feeding.done():
                await asyncio.sleep(rng.uniform(0.2, 0.6))
                label = rng.choice(sorted(workers))
                victim = workers.pop(label)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                kills += 1
                fresh = f"w{len(workers) + kills + 1}"
                workers[fresh] = spawn(srv.url, service, fresh)
            await feeding
            # The last kill: every worker at once; only the survivor is left to take their work.
            for p in workers.values():
                p.send_signal(signal.SIGKILL)
            killed = time.monotonic()

            async def drained() -> bool:
                # What the killed held is back in the LBS, run by the survivor and done: nothing is
                # pending.
                info = await r.xpending(f"{service}-input", f"{service}-group")
                return bool(info["pending"] == 0)

            assert await eventually(drained, TTL + 1.0 + 4.0, what="the killed workers' work"), (
                "the killed workers' work is not back within the lease TTL + 1 s "
                "(+4 s for a loaded machine)"
            )
            back_in = time.monotonic() - killed
            events = [f for _, f in await r.xrange(audit)]
            ended = {f[b"name"].decode() for f in events if f[b"ev"] == b"end"}
            assert ended == set(names), f"lost: {sorted(set(names) - ended)[:10]}"
        finally:
            for p in workers.values():
                p.kill()
                p.wait()
            await survivor.close()
            await serving
        tokens: dict[str, list[int]] = defaultdict(list)
        for f in events:
            if f[b"ev"] == b"start":
                tokens[f[b"name"].decode()].append(int(f[b"token"]))
        await r.aclose()
        # Fencing: every later run of a stream holds a greater token than every earlier one.
        assert all(t == sorted(set(t)) for t in tokens.values()), {
            s: t for s, t in tokens.items() if t != sorted(set(t))
        }
        again = sum(len(t) - 1 for t in tokens.values())
        print(
            f"read-kill {'full' if FULL else 'smoke'}: {STREAMS} streams, {kills + len(workers)} "
            f"kill -9, {again} run again, the last kill's work back and done in {back_in:.2f} s "
            f"(lock TTL {TTL:g} s)",
            flush=True,
        )
