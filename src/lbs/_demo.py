"""The demo behind ``python -m lbs demo``: a Spark job writes the work, consumers process it, on one Redis.

1. The work comes from a Spark job: a DataFrame of the demo's events (one
   row per event: column ``stream`` names its data stream, ``value`` and
   ``user`` are the payload) is written with the lbs Spark sink
   (``df.write.format("lbs")``), which appends every row to its data stream
   and registers each data stream once in the LBS. The job runs in a child
   process (``python -m lbs._demo spark URL SERVICE``, the rows as JSON on
   its stdin) with :func:`lbs.spark.local_session` (``local[2]``); the
   session is stopped and the JVM gone before the consumers start. Spark
   takes 10-15 s to start. Without pyspark (the ``lbs-streams[spark]`` extra;
   ``make setup`` installs it) or without a Java runtime, an
   :class:`lbs.Producer` registers the data streams instead. Either way a
   malformed entry slips into the LBS (written directly, a producer bug).
   The sink registers a stream with an empty ``Info``, so the handler reads
   the user from the stream's events.
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
7. Keyed, ordered processing (:mod:`lbs._demo_keyed`): support tickets whose
   events are handled one by one, in order, by one desk at a time, across a
   desk killed in the middle of a ticket.

``python -m lbs._demo doomed URL SERVICE`` is the consumer that gets killed;
``python -m lbs._demo spark URL SERVICE`` is step 1's Spark job.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from _lbscore import try_decode_input

from . import _keys
from .client import Client, Handler
from .config import Config
from .notifications import Notification
from ._demo_keyed import KeyedResult, run_keyed_demo
from .producer import Producer

Printer = Callable[[str], None]

#: The demo's poison pill is dead-lettered after this many failed attempts.
POISON_MAX_RETRIES = 2
#: The killed consumer's lock TTL: how long its stream stays locked after SIGKILL.
CRASH_LOCK_TTL = 1.0
#: The Spark job's master: a local Spark with two worker threads.
SPARK_MASTER = "local[2]"
#: How long the Spark job may take, session start included (a busy 2-core machine is slow).
SPARK_TIMEOUT = 600.0

#: One row per event: the data stream it belongs to, then its payload fields.
Row = tuple[str, int, str]


@dataclass
class DemoResult:
    registered: int = 0
    #: Who wrote the work: "spark" (the lbs Spark sink) or "producer" (lbs.Producer).
    source: str = ""
    spark_seconds: float = -1.0
    processed: Counter[str] = field(default_factory=Counter)
    dead_letters: int = 0
    crash_recovery_s: float = -1.0
    poison_retries: int = -1
    handed_back: int = 0
    hand_back_pickup_ms: float = -1.0
    leftover_pending: int = -1
    leftover_entries: int = -1
    leftover_locks: int = -1
    #: The keyed scenario (:mod:`lbs._demo_keyed`).
    tickets: KeyedResult | None = None

    @property
    def ok(self) -> bool:
        return (
            self.tickets is not None and self.tickets.ok
            and sum(self.processed.values()) == self.registered
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
        # The events of each data stream, for the consumers to read: one row per event.
        rows: list[Row] = [(name, n * 10 + e, f"u{n}") for n, name in enumerate(every_name) for e in range(events)]
        first, later = [row for row in rows if row[0] in names], [row for row in rows if row[0] in late]
        lbs_key = _keys.input_stream(service)
        unavailable = _spark_unavailable()
        if unavailable is None:
            # A producer bug first: an entry that is not an assignment.
            await r.xadd(lbs_key, {_keys.INPUT_FIELD: "{not json"})
            out(f"a producer bug: one malformed entry written straight into {lbs_key}")
            out(f"spark: starting a local Spark job ({SPARK_MASTER}, in a child process) to write the work; "
                f"Spark takes 10-15 s to start, and its first job a few more ...")
            timings = await _spark_write(url, service, first)
            result.source, result.spark_seconds = "spark", timings["total_s"]
            entries: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(lbs_key)  # type: ignore[assignment]
            registered = Counter(try_decode_input(f[_keys.INPUT_FIELD.encode()])[0] for _, f in entries)
            result.registered = sum(registered[name] for name in names)
            once = "once each" if set(registered.values()) == {1} else f"counts {dict(registered)}"
            out(f"spark: the work came from a Spark job: the lbs sink appended {len(first)} rows (events) to "
                f"{len(names)} data streams and registered {result.registered} data streams in {lbs_key}, "
                f"{once}; {timings['total_s']:.1f} s (session start {timings['start_s']:.1f} s, write "
                f"{timings['write_s']:.1f} s); Spark stopped")
            await _xadd_rows(r, later)  # the late streams' events; a producer registers them in step 3
        else:
            out(f"{unavailable}: registering with lbs.Producer instead")
            await _xadd_rows(r, rows)
            async with Producer(r, service) as producer:
                # A producer bug first: an entry that is not an assignment.
                await r.xadd(lbs_key, {_keys.INPUT_FIELD: "{not json"})
                ids = await producer.add_streams((name, {"user": f"u{i}"}) for i, name in enumerate(names))
            result.source, result.registered = "producer", len(ids)
            out(f"producer: one malformed entry, then registered {len(ids)} data streams in {lbs_key} "
                f"in one round trip")

        def handler_for(consumer: str, slow: asyncio.Event | None = None) -> Handler:
            async def handle(note: Notification) -> None:
                if note.stream.startswith("poison"):
                    raise ValueError(f"cannot parse {note.stream} (attempt {note.retry_count + 1})")
                events_: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(note.stream)  # type: ignore[assignment]
                total = sum(int(f[b"value"]) for _, f in events_)
                # The Spark sink registers with an empty Info: the events say whose stream it is.
                user = note.info.get("user") or (events_[0][1].get(b"user", b"?").decode() if events_ else "?")
                if slow is not None and note.stream.startswith("late"):
                    slow.set()
                    await asyncio.sleep(3600)  # still working when its consumer shuts down
                await asyncio.sleep(0.02)  # the application's work
                result.processed[consumer] += 1
                finished_at[note.stream] = time.perf_counter()
                out(f"{consumer}: {note.stream} (token {note.token}, user {user}) -> "
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
        paths = {k.split("_")[1]: int(v) for k, v in c.metrics.items() if k.endswith("_requeued_total") and v}
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

        # Keyed, ordered processing: tickets whose events go one by one, in order, across a kill.
        result.tickets = await run_keyed_demo(url, f"{service}-tickets", out)
    finally:
        for each in clients:
            await each.close()
        await r.aclose()
    return result


async def _xadd_rows(r: aioredis.Redis, rows: list[Row]) -> None:
    """Append each event to its data stream, in one round trip."""
    pipe = r.pipeline(transaction=False)
    for stream, value, user in rows:
        pipe.xadd(stream, {"value": value, "user": user})
    await pipe.execute()


def _spark_unavailable() -> str | None:
    """Why the demo cannot write its work with Spark here, or None when it can."""
    try:
        import pyarrow  # noqa: F401
        from . import spark  # noqa: F401 - needs pyspark >= 4.0
    except ImportError:
        return "pyspark not installed (pip install 'lbs-streams[spark]')"
    if not (os.environ.get("JAVA_HOME") or shutil.which("java")):
        return "pyspark is installed but Spark needs a Java runtime (none on PATH, no JAVA_HOME)"
    return None


async def _spark_write(url: str, service: str, rows: list[Row]) -> dict[str, float]:
    """Run :func:`_spark_job` in a child process; return its timings (seconds), ``total_s`` included.

    A child process keeps Spark's JVM, its start-up chatter on stderr and its
    threads out of the demo's process; the JVM exits with it.
    """
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "lbs._demo", "spark", url, service,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(json.dumps(rows).encode()), SPARK_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        tail = "\n".join(stderr.decode(errors="replace").strip().splitlines()[-20:])
        raise RuntimeError(f"the Spark job exited with {proc.returncode}:\n{tail}")
    timings: dict[str, float] = json.loads(stdout.decode().strip().splitlines()[-1])
    timings["total_s"] = time.perf_counter() - started
    return timings


def _spark_job(url: str, service: str, rows: list[Row]) -> dict[str, float]:
    """Step 1's Spark job: write ``rows`` with the lbs sink, stop the session; return the timings."""
    from .spark import local_session

    started = time.perf_counter()
    spark = local_session(SPARK_MASTER, app_name="lbs-demo")
    ready = time.perf_counter()
    try:
        df = spark.createDataFrame(rows, "stream string, value long, user string")
        df.write.format("lbs").option("url", url).option("service", service).mode("append").save()
        written = time.perf_counter()
    finally:
        spark.stop()
    return {"start_s": ready - started, "write_s": written - ready}


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
    if len(sys.argv) != 4 or sys.argv[1] not in ("doomed", "spark"):
        sys.exit("usage: python -m lbs._demo {doomed,spark} URL SERVICE")
    if sys.argv[1] == "spark":
        rows_in = [(str(s), int(v), str(u)) for s, v, u in json.load(sys.stdin)]
        print(json.dumps(_spark_job(sys.argv[2], sys.argv[3], rows_in)), flush=True)
    else:
        asyncio.run(_doomed(sys.argv[2], sys.argv[3]))
