"""Step 4 of the demo: a consumer in another process (``python -m lbs._demo_crash URL SERVICE``,
``consumer-x``) takes a stream and is killed with SIGKILL, holding it (see :mod:`lbs._demo`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable

from ._waits import within
from .client import Client
from .config import Config

__all__ = ["CRASH_LOCK_TTL", "kill_a_consumer", "kill_after_first_line"]

#: The killed consumer's lease TTL (``Config.lock_ttl``): how long its stream stays held after SIGKILL.
CRASH_LOCK_TTL = 1.0


async def kill_after_first_line(exited: str, *argv: str) -> tuple[str, int, float]:
    """Run ``python -m <argv>``, wait (30 s at most) for the first line it prints, and SIGKILL it:
    (that line, its pid, when it was killed, ``time.perf_counter()``). When it exits before saying
    anything, a RuntimeError says ``exited`` with its exit code in place of ``{}``."""
    doomed = subprocess.Popen(  # noqa: ASYNC220 - returns at once; its pipe is read in a thread
        [sys.executable, "-m", *argv],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert doomed.stdout is not None
        line = await within(asyncio.to_thread(doomed.stdout.readline), 30)
        if not line:
            raise RuntimeError(exited.format(doomed.wait()))
        doomed.kill()
        killed_at = time.perf_counter()
    finally:
        doomed.kill()
        doomed.wait()
        if doomed.stdout:
            doomed.stdout.close()
    return line, doomed.pid, killed_at


async def kill_a_consumer(url: str, service: str, out: Callable[[str], None]) -> float:
    """Start consumer-x, wait until it holds a stream, SIGKILL it and say so; when it was killed."""
    line, pid, killed_at = await kill_after_first_line(
        "the doomed consumer exited with {} before taking a stream", "lbs._demo_crash", url, service
    )
    held_note = json.loads(line)
    out(
        f"consumer-x (pid {pid}) took {held_note['stream']} (token {held_note['token']}, "
        f"lease TTL {CRASH_LOCK_TTL:.0f} s) and was killed with SIGKILL"
    )
    return killed_at


async def _doomed(url: str, service: str) -> None:
    """A consumer that takes one stream, says so on stdout, and waits to be killed."""
    config = Config(lock_ttl=CRASH_LOCK_TTL, read_block=0.1, max_streams=1, recovery=False)
    client = Client(
        url, service, consumer_id="consumer-x", config=config, load_entrypoint_plugins=False
    )
    await client.start()
    async for note in client.notifications():
        print(json.dumps({"stream": note.stream, "token": note.token}), flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m lbs._demo_crash URL SERVICE")
    asyncio.run(_doomed(sys.argv[1], sys.argv[2]))
