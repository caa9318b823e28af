"""The demo behind ``python -m lbs demo``: a producer and two consumers on one Redis.

1. A producer registers data streams (each with some events of its own) and
   one malformed entry slips into the LBS.
2. Two :class:`lbs.Client` consumers ``run()`` a handler: they take streams
   round-robin under fenced locks, finish each one (lock released, entry acked
   and deleted in one step); the malformed entry lands in the dead-letter
   stream with its reason, and nobody's reader dies. With the lbs-prometheus
   plugin installed (``make setup`` installs it) the consumers' metrics are
   served on a free port and scraped over HTTP.
3. One consumer shuts down while holding streams: ``close()`` hands them back
   at once and the other consumer takes them without waiting for a lock TTL.
4. A consumer in another process takes a stream and is killed with SIGKILL:
   recovery (the deadline index) puts the stream back once its lock's TTL has
   passed, and a live consumer finishes it, with the retry counted.
5. A poison pill: a stream whose handler fails every time is retried
   ``max_retries`` times and then lands in the dead-letter stream with its
   retry count, reason and original entry id.
6. It checks that nothing is left: no pending entries, no LBS entries, no locks.

``python -m lbs._demo doomed URL SERVICE`` is the consumer that gets killed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from . import _keys
from .client import Client, Handler
from .config import Config
from .notifications import Notification
from .producer import Producer

Printer = Callable[[str], None]

#: The demo's poison pill is dead-lettered after this many failed attempts.
POISON_MAX_RETRIES = 2
#: The killed consumer's lock TTL: how long its stream stays locked after SIGKILL.
CRASH_LOCK_TTL = 1.0


@dataclass
class DemoResult:
    registered: int = 0
    processed: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    crash_recovery_s: float = -1.0
    poison_retries: int = -1
    handed_back: int = 0
    hand_back_pickup_ms: float = -1.0
    leftover_pending: int = -1
    leftover_entries: int = -1
    leftover_locks: int = -1

    @property
    def ok(self) -> bool:
        return (
            sum(self.processed.values()) == self.registered
            and self.dead_letters == 2
            and self.crash_recovery_s >= 0
            and self.poison_retries == POISON_MAX_RETRIES + 1
            and self.leftover_pending == 0
            and self.leftover_entries == 0
            and self.leftover_locks == 0
        )


async def run_demo(
    url: str, *, service: str = "demo", streams: int = 6, consumers: int = 2,
    events: int = 3, out: Printer = print,
) -> DemoResult:
    """Run the demo against the Redis at ``url``; return what happened."""
    result = DemoResult()
    r = aioredis.Redis.from_url(url)
    # max_streams=2 so the demo's handful of streams spreads over both consumers.
    config = Config(lock_ttl=30.0, read_block=0.1, max_streams=2, max_retries=POISON_MAX_RETRIES)
    names = [f"session-{i + 1}" for i in range(streams)]
    late = [f"late-{i + 1}" for i in range(2)]
    every_name = names + late
    all_done = asyncio.Event()
    finished_at: dict[str, float] = {}
    clients: list[Client] = []
    try:
        # The data streams themselves: some events each, for the consumers to read.
        pipe = r.pipeline(transaction=False)
        for n, name in enumerate(every_name):
            for e in range(events):
                pipe.xadd(name, {"value": n * 10 + e})
        await pipe.execute()

        async with Producer(r, service) as producer:
            # A producer bug first: an entry that is not an assignment.
            await r.xadd(_keys.input_stream(service), {_keys.INPUT_FIELD: "{not json"})
            ids = await producer.add_streams((name, {"user": f"u{i}"}) for i, name in enumerate(names))
        result.registered = len(ids)
        out(f"producer: one malformed entry, then registered {len(ids)} data streams in "
            f"{_keys.input_stream(service)} in one round trip")

        def handler_for(consumer: str, slow: asyncio.Event | None = None) -> Handler:
            async def handle(note: Notification) -> None:
                if note.stream.startswith("poison"):
                    raise ValueError(f"cannot parse {note.stream} (attempt {note.retry_count + 1})")
                events_: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(note.stream)  # type: ignore[assignment]
                total = sum(int(f[b"value"]) for _, f in events_)
                if slow is not None and note.stream.startswith("late"):
                    slow.set()
                    await asyncio.sleep(3600)  # still working when its consumer shuts down
                await asyncio.sleep(0.02)  # the application's work
                result.processed[consumer] += 1
                finished_at[note.stream] = time.perf_counter()
                out(f"{consumer}: {note.stream} (token {note.token}, info {note.info}) -> "
                    f"{len(events_)} events, sum {total}; done")
                if sum(result.processed.values()) >= result.registered:
                    all_done.set()
            return handle

        started = time.perf_counter()
        a_busy = asyncio.Event()
        runners = []
        metrics, scrape = _metrics_plugin(out)
        for n in range(consumers):
            consumer = f"consumer-{chr(97 + n)}"
            client = Client(r, service, consumer_id=consumer, config=config, plugins=metrics,
                            load_entrypoint_plugins=False)
            clients.append(client)
            runners.append(asyncio.create_task(client.run(handler_for(consumer, a_busy if n == 0 else None))))
        await asyncio.wait_for(all_done.wait(), timeout=30)
        out(f"all {result.registered} data streams processed in {time.perf_counter() - started:.2f}s "
            f"({', '.join(f'{c} {n}' for c, n in sorted(result.processed.items()))})")
        if scrape is not None:
            await scrape()

        deadline = time.monotonic() + 10
        while not await r.exists(_keys.dead_letter_stream(service)) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        dlq: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(  # type: ignore[assignment]
            _keys.dead_letter_stream(service))
        result.dead_letters = len(dlq)
        for _, f in dlq:
            out(f"dead letter: {f[b'lbs-input'].decode()!r}: {f[b'_reason'].decode()}")

        # Hand-back: consumer-a takes the late streams and shuts down mid-work.
        all_done.clear()
        result.registered += len(late)
        for other in clients[1:]:  # let consumer-a take them first
            await other.close()
        async with Producer(r, service) as producer:
            await producer.add_streams(late)
        await asyncio.wait_for(a_busy.wait(), timeout=30)
        held = clients[0].held
        closed_at = time.perf_counter()
        await clients[0].close()
        result.handed_back = held
        out(f"consumer-a shut down holding {held} stream(s): handed back to the LBS at once")
        b = Client(r, service, consumer_id="consumer-b", config=config, load_entrypoint_plugins=False)
        clients.append(b)
        runners.append(asyncio.create_task(b.run(handler_for("consumer-b"))))
        await asyncio.wait_for(all_done.wait(), timeout=30)
        result.hand_back_pickup_ms = (max(finished_at[n] for n in late) - closed_at) * 1000
        out(f"consumer-b finished them {result.hand_back_pickup_ms:.0f} ms later "
            f"(the lock TTL is {config.lock_ttl:.0f} s: nobody waited for it)")

        for each in clients:
            await each.close()
        await asyncio.gather(*runners)

        # Crash: a consumer in another process takes a stream, then dies with SIGKILL.
        all_done.clear()
        result.registered += 1
        async with Producer(r, service) as producer:
            await producer.add_stream("crash-1", {"user": "u-crash"})
        doomed = subprocess.Popen([sys.executable, "-m", "lbs._demo", "doomed", url, service],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert doomed.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(doomed.stdout.readline), timeout=30)
            if not line:
                raise RuntimeError(f"the doomed consumer exited with {doomed.wait()} before taking a stream")
            held_note = json.loads(line)
            doomed.kill()
            killed_at = time.perf_counter()
            out(f"consumer-x (pid {doomed.pid}) took {held_note['stream']} (token {held_note['token']}, "
                f"lock TTL {CRASH_LOCK_TTL:.0f} s) and was killed with SIGKILL")
        finally:
            doomed.kill()
            doomed.wait()
            if doomed.stdout:
                doomed.stdout.close()
        c = Client(r, service, consumer_id="consumer-c", config=config, load_entrypoint_plugins=False)
        clients.append(c)
        runners.append(asyncio.create_task(c.run(handler_for("consumer-c"))))
        await asyncio.wait_for(all_done.wait(), timeout=30)
        result.crash_recovery_s = finished_at["crash-1"] - killed_at
        paths = {k.split("_")[1]: int(v) for k, v in c.recovery.counts.items() if k.endswith("_requeued_total") and v}
        out(f"consumer-c's recovery re-queued crash-1 once its lock had expired ({paths}); consumer-c "
            f"finished it {result.crash_recovery_s:.2f} s after the kill")

        # Poison pill: its handler fails every time; after max_retries it is a dead letter.
        async with Producer(r, service) as producer:
            await producer.add_stream("poison-1", {"user": "u-poison"})
        dlq_key = _keys.dead_letter_stream(service)
        deadline = time.monotonic() + 30
        while await r.xlen(dlq_key) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the poison pill never reached the dead-letter stream")
            await asyncio.sleep(0.01)
        last: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrevrange(dlq_key, count=1)  # type: ignore[assignment]
        pill = last[0][1]
        result.dead_letters = await r.xlen(dlq_key)
        result.poison_retries = int(pill[b"_retry_count"])
        out(f"dead letter: poison-1 after {result.poison_retries} failed attempts "
            f"(max_retries {POISON_MAX_RETRIES}): {pill[b'_reason'].decode()}; "
            f"original entry {pill[b'_original_id'].decode()}")

        await c.close()
        await asyncio.gather(*runners)
        stream, group = _keys.input_stream(service), _keys.group_name(service)
        result.leftover_pending = (await r.xpending(stream, group))["pending"]
        result.leftover_entries = await r.xlen(stream)
        result.leftover_locks = len([k async for k in r.scan_iter(match=_keys.lock_key(service, "*"))])
        out(f"left behind: {result.leftover_pending} pending, {result.leftover_entries} LBS entries, "
            f"{result.leftover_locks} locks; {result.dead_letters} dead letters")
        await r.delete(*every_name, _keys.dead_letter_stream(service), stream, _keys.fence_key(service))
    finally:
        for each in clients:
            await each.close()
        await r.aclose()
    return result


def _metrics_plugin(out: Printer) -> tuple[list[object], Callable[[], Awaitable[None]] | None]:
    """The lbs-prometheus plugin serving /metrics on a free port, when it is installed (make setup does)."""
    try:
        from lbs_prometheus import PrometheusPlugin  # type: ignore[import-not-found, unused-ignore]
        from prometheus_client import CollectorRegistry
    except ImportError:
        return [], None
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry())
    url = f"http://127.0.0.1:{plugin.port}/metrics"

    def fetch() -> list[str]:
        with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - our own loopback endpoint
            text: str = resp.read().decode()
        return [line for line in text.splitlines()
                if line.startswith(("lbs_locks_acquired_total", "lbs_locks_released_total", "lbs_held_streams"))]

    async def scrape() -> None:
        lines = await asyncio.to_thread(fetch)
        out(f"metrics (lbs-prometheus plugin, scraped over HTTP from {url}):")
        for line in lines:
            out("  " + line)

    return [plugin], scrape


async def _doomed(url: str, service: str) -> None:
    """A consumer that takes one stream, says so on stdout, and waits to be killed."""
    config = Config(lock_ttl=CRASH_LOCK_TTL, read_block=0.1, max_streams=1, recovery=False)
    client = Client(url, service, consumer_id="consumer-x", config=config, load_entrypoint_plugins=False)
    await client.start()
    async for note in client.notifications():
        print(json.dumps({"stream": note.stream, "token": note.token}), flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "doomed":
        sys.exit("usage: python -m lbs._demo doomed URL SERVICE")
    asyncio.run(_doomed(sys.argv[2], sys.argv[3]))
