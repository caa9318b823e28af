"""The demo behind ``python -m lbs demo``: a Spark job writes the work, consumers process it, on one Redis.

1. The work comes from a Spark job: a DataFrame of the demo's events (one
   row per event: column ``stream`` names its data stream, ``value`` and
   ``user`` are the payload) is written with the lbs Spark sink
   (``df.write.format("lbs")``), which appends every row to its data stream
   and registers each data stream once in the LBS. The job runs in a child
   process (``python -m lbs._demo spark URL SERVICE``, the rows as JSON on
   its stdin) with :func:`lbs.spark.local_session` (``local[2]``); the
   session is stopped and the JVM gone before the consumers start. The job
   takes 20-60 s on a 2-core machine (:data:`SPARK_JOB_TIME`): 9-20 s to
   start the JVM and the session, the rest for its first job.
   With ``spark=False`` (``lbs demo --no-spark``), without pyspark (the
   ``lbs-streams[spark]`` extra; ``make setup`` installs it) or without a Java
   runtime, an :class:`lbs.Producer` registers the data streams instead.
   Either way a malformed entry slips into the LBS (written directly, a
   producer bug).
   The sink registers a stream with an empty ``Info``, so the handler reads
   the user from the stream's events.
2. Two :class:`lbs.Client` consumers ``run()`` a handler: they take streams
   round-robin, each held under its consumer's lease with a fencing token,
   and finish each one (entry acked and deleted, name released, in one step); the malformed entry lands in the dead-letter
   stream with its reason, and nobody's reader dies. With the lbs-prometheus
   plugin installed (``make setup`` installs it) the consumers' metrics are
   served on a free port and scraped over HTTP.
3. One consumer shuts down while holding streams: ``close()`` hands them back
   at once and the other consumer takes them without waiting for a lease TTL.
4. A consumer in another process takes a stream and is killed with SIGKILL:
   recovery (the deadline index) puts the stream back once the dead
   consumer's lease has expired, and a live consumer finishes it, with the
   retry counted.
5. A poison pill: a stream whose handler fails every time is retried
   ``max_retries`` times and then lands in the dead-letter stream with its
   retry count, reason and original entry id.
6. It checks that nothing is left: no pending entries, no LBS entries, no leases.
7. Keyed, ordered processing (:mod:`lbs._demo_keyed`): support tickets whose
   events are handled one by one, in order, by one desk at a time, across a
   desk killed in the middle of a ticket.

Every key the demo writes is one of its service's (:func:`demo_keys`): the
LBS ``<service>-input``, the keys under its hash tag ``{<service>-input}:``
(the data streams among them, ``{<service>-input}:session-1`` ... and the
consumers' leases) and ``lock:{<service>-input}:*`` (the lock per entry's
pattern, still counted as the demo's: lbs writes no such key under the
consumer lease), and the same for the keyed scenario's
service ``<service>-tickets``. :func:`run_demo` refuses to start
(:class:`ServiceInUseError`) when any such key exists, so it never writes
into, or deletes, anyone else's data, and deletes every one of them at the
end, whatever happened (:mod:`lbs._demo_keys`).

Each step is one method of :class:`_Demo`; :func:`run_demo` calls them in
order. ``python -m lbs._demo_crash URL SERVICE`` is the consumer that gets
killed (:mod:`lbs._demo_crash`); ``python -m lbs._demo_spark URL SERVICE`` is step 1's Spark
job (:mod:`lbs._demo_spark`).
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from _lbscore import try_decode_input

from . import _keys
from ._demo_crash import CRASH_LOCK_TTL, kill_a_consumer
from ._demo_keyed import KeyedResult, keyed_service, run_keyed_demo
from ._demo_keys import (
    MIN_REDIS,
    ServiceInUseError,
    check_server,
    data_stream,
    delete_demo_keys,
    demo_keys,
    describe_keys,
    find_demo_keys,
)
from ._demo_spark import SPARK_JOB_TIME, SPARK_MASTER, Progress, Row, spark_write
from ._demo_spark import spark_unavailable as _spark_unavailable
from ._redis.connection import open_plain
from .client import Client, Handler
from .config import Config
from .notifications import Notification
from .producer import Producer

__all__ = [
    "CRASH_LOCK_TTL",
    "MIN_REDIS",
    "POISON_MAX_RETRIES",
    "SPARK_JOB_TIME",
    "DemoResult",
    "ServiceInUseError",
    "check_server",
    "data_stream",
    "delete_demo_keys",
    "demo_keys",
    "describe_keys",
    "find_demo_keys",
    "run_demo",
]

Printer = Callable[[str], None]

#: The demo's poison pill is dead-lettered after this many failed attempts.
POISON_MAX_RETRIES = 2


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
    leftover_leases: int = -1
    #: The keyed scenario (:mod:`lbs._demo_keyed`).
    tickets: KeyedResult | None = None

    @property
    def ok(self) -> bool:
        return (
            self.tickets is not None
            and self.tickets.ok
            and sum(self.processed.values()) == self.registered
            and self.dead_letters == 2
            and self.crash_recovery_s >= 0
            and self.poison_retries == POISON_MAX_RETRIES + 1
            and self.leftover_pending == 0
            and self.leftover_entries == 0
            and self.leftover_leases == 0
        )


async def run_demo(
    url: str,
    *,
    service: str = "demo",
    streams: int = 6,
    consumers: int = 2,
    events: int = 3,
    spark: bool = True,
    out: Printer = print,
    progress: Progress | None = None,
) -> DemoResult:
    """Run the demo against the Redis at ``url``; return what happened.

    ``spark=False`` registers the work with :class:`lbs.Producer` instead of
    a Spark job. ``out`` gets the demo's lines, ``progress`` (if given) a
    status line every half second while the Spark job runs, then None.
    Raises :class:`ServiceInUseError` before writing anything when keys of
    ``service`` exist (:func:`demo_keys`), and deletes all of them at the end.
    """
    _keys.validate_service(service)
    r = open_plain(url)
    try:
        server = await check_server(r, service)
    except BaseException:
        await r.aclose()
        raise
    demo = _Demo(url, service, r, streams, out)
    try:
        out(f"server: {server}")
        out(
            f"keys: the demo writes only {describe_keys(service)} (data streams {demo.prefix}session-1 ...), "
            f"and deletes them at the end"
        )
        await demo.register(events, spark, progress)
        await demo.process(consumers)
        await demo.hand_back()
        await demo.crash()
        await demo.poison_pill()
        await demo.left_behind()
        # Keyed, ordered processing: tickets whose events go one by one, in order, across a kill.
        demo.result.tickets = await run_keyed_demo(url, keyed_service(service), out)
    finally:
        await demo.clean_up()
    return demo.result


class _Demo:
    """The demo's shared state (its Redis, names, consumers, what happened), and one method per step."""

    def __init__(
        self, url: str, service: str, r: aioredis.Redis, streams: int, out: Printer
    ) -> None:
        self.url, self.service, self.r, self.out = url, service, r, out
        self.result = DemoResult()
        # max_streams=2 so the demo's handful of streams spreads over both consumers; drain_timeout=0 so
        # the consumer that shuts down mid-stream (step 3) hands its running streams back at once.
        self.config = Config(
            lock_ttl=30.0,
            read_block=0.1,
            max_streams=2,
            max_retries=POISON_MAX_RETRIES,
            drain_timeout=0.0,
        )
        self.prefix = data_stream(service, "")
        self.names = [data_stream(service, f"session-{i + 1}") for i in range(streams)]
        self.late = [data_stream(service, f"late-{i + 1}") for i in range(2)]
        self.crash_stream = data_stream(service, "crash-1")
        self.poison = data_stream(service, "poison-1")
        self.lbs_key = _keys.input_stream(service)
        self.dlq_key = _keys.dead_letter_stream(service)
        self.all_done = asyncio.Event()
        self.finished_at: dict[str, float] = {}
        self.clients: list[Client] = []
        self.runners: list[asyncio.Task[None]] = []
        #: Set when consumer-a runs a late stream (step 3 shuts it down then).
        self.a_busy = asyncio.Event()

    # ------------------------------------------------------------ step 1 ---

    async def register(self, events: int, spark: bool, progress: Progress | None) -> None:
        """Step 1: the work, from a Spark job (or a producer), after a malformed entry."""
        r, out, result, names = self.r, self.out, self.result, self.names
        # The events of each data stream, for the consumers to read: one row per event.
        rows: list[Row] = [
            (name, n * 10 + e, f"u{n}")
            for n, name in enumerate(names + self.late)
            for e in range(events)
        ]
        first, later = (
            [row for row in rows if row[0] in names],
            [row for row in rows if row[0] in self.late],
        )
        lbs_key = self.lbs_key
        unavailable = _spark_unavailable() if spark else "Spark skipped (--no-spark)"
        if unavailable is None:
            # A producer bug first: an entry that is not an assignment.
            await r.xadd(lbs_key, {_keys.INPUT_FIELD: "{not json"})
            out(f"a producer bug: one malformed entry written straight into {lbs_key}")
            out(
                f"spark: starting a local Spark job ({SPARK_MASTER}, in a child process) to write the work; "
                f"it takes {SPARK_JOB_TIME} on 2 cores, starting the JVM and a session first "
                f"(lbs demo --no-spark skips it) ..."
            )
            timings = await spark_write(self.url, self.service, first, progress)
            result.source, result.spark_seconds = "spark", timings["total_s"]
            entries: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(lbs_key)  # type: ignore[assignment]
            registered = Counter(
                try_decode_input(f[_keys.INPUT_FIELD.encode()])[0] for _, f in entries
            )
            result.registered = sum(registered[name] for name in names)
            once = "once each" if set(registered.values()) == {1} else f"counts {dict(registered)}"
            out(
                f"spark: the work came from a Spark job: the lbs sink appended {len(first)} rows (events) to "
                f"{len(names)} data streams and registered {result.registered} data streams in {lbs_key}, "
                f"{once}; {timings['total_s']:.1f} s (session start {timings['start_s']:.1f} s, write "
                f"{timings['write_s']:.1f} s); Spark stopped"
            )
            await _xadd_rows(
                r, later
            )  # the late streams' events; a producer registers them in step 3
        else:
            out(f"{unavailable}: registering with lbs.Producer instead")
            await _xadd_rows(r, rows)
            async with Producer(r, self.service) as producer:
                # A producer bug first: an entry that is not an assignment.
                await r.xadd(lbs_key, {_keys.INPUT_FIELD: "{not json"})
                ids = await producer.add_streams(
                    (name, {"user": f"u{i}"}) for i, name in enumerate(names)
                )
            result.source, result.registered = "producer", len(ids)
            out(
                f"producer: one malformed entry, then registered {len(ids)} data streams in {lbs_key} "
                f"in one round trip"
            )

    def handler_for(self, consumer: str, slow: asyncio.Event | None = None) -> Handler:
        """The demo's handler for ``consumer``: sums a stream's events; a poison pill always fails;
        with ``slow``, a late stream is still running when its consumer shuts down (step 3)."""
        r, out, result = self.r, self.out, self.result

        async def handle(note: Notification) -> None:
            short = note.stream.removeprefix(self.prefix)
            if short.startswith("poison"):
                raise ValueError(f"cannot parse {note.stream} (attempt {note.retry_count + 1})")
            events_: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(note.stream)  # type: ignore[assignment]
            total = sum(int(f[b"value"]) for _, f in events_)
            # The Spark sink registers with an empty Info: the events say whose stream it is.
            user = note.info.get("user") or (
                events_[0][1].get(b"user", b"?").decode() if events_ else "?"
            )
            if slow is not None and short.startswith("late"):
                slow.set()
                await asyncio.sleep(3600)  # still working when its consumer shuts down
            await asyncio.sleep(0.02)  # the application's work
            result.processed[consumer] += 1
            self.finished_at[note.stream] = time.perf_counter()
            out(
                f"{consumer}: {note.stream} (token {note.token}, user {user}) -> "
                f"{len(events_)} events, sum {total}; done"
            )
            if sum(result.processed.values()) >= result.registered:
                self.all_done.set()

        return handle

    def _start(
        self, consumer: str, slow: asyncio.Event | None = None, plugins: Iterable[object] = ()
    ) -> Client:
        """A consumer of the demo's service running the demo's handler."""
        client = Client(
            self.r,
            self.service,
            consumer_id=consumer,
            config=self.config,
            plugins=plugins,
            load_entrypoint_plugins=False,
        )
        self.clients.append(client)
        self.runners.append(asyncio.create_task(client.run(self.handler_for(consumer, slow))))
        return client

    # ------------------------------------------------------------ step 2 ---

    async def process(self, consumers: int) -> None:
        """Step 2: ``consumers`` consumers run every registered stream; the malformed entry is a dead letter."""
        r, out, result = self.r, self.out, self.result
        started = time.perf_counter()
        metrics, scrape = _metrics_plugin(out)
        for n in range(consumers):
            self._start(f"consumer-{chr(97 + n)}", self.a_busy if n == 0 else None, plugins=metrics)
        await asyncio.wait_for(self.all_done.wait(), timeout=30)
        out(
            f"all {result.registered} data streams processed in {time.perf_counter() - started:.2f}s "
            f"({', '.join(f'{c} {n}' for c, n in sorted(result.processed.items()))})"
        )
        if scrape is not None:
            await scrape()

        deadline = time.monotonic() + 10
        while not await r.exists(self.dlq_key) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        dlq: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(self.dlq_key)  # type: ignore[assignment]
        result.dead_letters = len(dlq)
        for _, f in dlq:
            out(f"dead letter: {f[b'lbs-input'].decode()!r}: {f[b'_reason'].decode()}")

    # ------------------------------------------------------------ step 3 ---

    async def hand_back(self) -> None:
        """Step 3: consumer-a takes the late streams and shuts down mid-work; consumer-b takes them at once."""
        out, result, clients = self.out, self.result, self.clients
        self.all_done.clear()
        result.registered += len(self.late)
        for other in clients[1:]:  # let consumer-a take them first
            await other.close()
        async with Producer(self.r, self.service) as producer:
            await producer.add_streams(self.late)
        await asyncio.wait_for(self.a_busy.wait(), timeout=30)
        held = clients[0].held
        closed_at = time.perf_counter()
        await clients[0].close()
        result.handed_back = held
        out(f"consumer-a shut down holding {held} stream(s): handed back to the LBS at once")
        self._start("consumer-b")
        await asyncio.wait_for(self.all_done.wait(), timeout=30)
        result.hand_back_pickup_ms = (
            max(self.finished_at[n] for n in self.late) - closed_at
        ) * 1000
        out(
            f"consumer-b finished them {result.hand_back_pickup_ms:.0f} ms later "
            f"(the lease TTL is {self.config.lock_ttl:.0f} s: nobody waited for it)"
        )

        for each in clients:
            await each.close()
        await asyncio.gather(*self.runners)

    # ------------------------------------------------------------ step 4 ---

    async def crash(self) -> None:
        """Step 4: a consumer in another process takes a stream, then dies with SIGKILL; consumer-c's
        recovery puts it back once the dead consumer's lease expired."""
        out, result, crash = self.out, self.result, self.crash_stream
        self.all_done.clear()
        result.registered += 1
        async with Producer(self.r, self.service) as producer:
            await producer.add_stream(crash, {"user": "u-crash"})
        killed_at = await kill_a_consumer(self.url, self.service, out)
        c = self._start("consumer-c")
        await asyncio.wait_for(self.all_done.wait(), timeout=30)
        result.crash_recovery_s = self.finished_at[crash] - killed_at
        paths = {
            k.split("_")[1]: int(v)
            for k, v in c.metrics.items()
            if k.endswith("_requeued_total") and v
        }
        out(
            f"consumer-c's recovery re-queued {crash} once its holder's lease had expired ({paths}); consumer-c "
            f"finished it {result.crash_recovery_s:.2f} s after the kill"
        )

    # ------------------------------------------------------------ step 5 ---

    async def poison_pill(self) -> None:
        """Step 5: a stream whose handler fails every time is a dead letter after ``max_retries``."""
        r, result = self.r, self.result
        async with Producer(r, self.service) as producer:
            await producer.add_stream(self.poison, {"user": "u-poison"})
        deadline = time.monotonic() + 30
        while await r.xlen(self.dlq_key) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the poison pill never reached the dead-letter stream")
            await asyncio.sleep(0.01)
        last: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrevrange(self.dlq_key, count=1)  # type: ignore[assignment]
        pill = last[0][1]
        result.dead_letters = await r.xlen(self.dlq_key)
        result.poison_retries = int(pill[b"_retry_count"])
        self.out(
            f"dead letter: {self.poison} after {result.poison_retries} failed attempts "
            f"(max_retries {POISON_MAX_RETRIES}): {pill[b'_reason'].decode()}; "
            f"original entry {pill[b'_original_id'].decode()}"
        )

    # ------------------------------------------------------------ step 6 ---

    async def left_behind(self) -> None:
        """Step 6: nothing is left: no pending entries, no LBS entries, no consumer's lease."""
        r, result, service = self.r, self.result, self.service
        await self.clients[-1].close()
        await asyncio.gather(*self.runners)
        stream, group = _keys.input_stream(service), _keys.group_name(service)
        result.leftover_pending = (await r.xpending(stream, group))["pending"]
        result.leftover_entries = await r.xlen(stream)
        result.leftover_leases = len(
            [k async for k in r.scan_iter(match=_keys.lease_prefix(service) + "*")]
        )
        self.out(
            f"left behind: {result.leftover_pending} pending, {result.leftover_entries} LBS entries, "
            f"{result.leftover_leases} leases; {result.dead_letters} dead letters"
        )

    async def clean_up(self) -> None:
        """Whatever happened: every consumer closed and every key of the demo's deleted (no other key
        existed under these names)."""
        try:
            for each in self.clients:
                await each.close()
            removed = await delete_demo_keys(self.r, self.service)
            self.out(
                f"cleaned up: deleted the demo's {removed} keys ({describe_keys(self.service)}); nothing else was touched"
            )
        finally:
            await self.r.aclose()


async def _xadd_rows(r: aioredis.Redis, rows: list[Row]) -> None:
    """Append each event to its data stream, in one round trip."""
    pipe = r.pipeline(transaction=False)
    for stream, value, user in rows:
        pipe.xadd(stream, {"value": value, "user": user})
    await pipe.execute()


def _metrics_plugin(out: Printer) -> tuple[list[object], Callable[[], Awaitable[None]] | None]:
    """The lbs-prometheus plugin serving /metrics on a free port, when it is installed (make setup does)."""
    try:
        from prometheus_client import CollectorRegistry

        from lbs_prometheus import PrometheusPlugin  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return [], None
    plugin = PrometheusPlugin(port=0, registry=CollectorRegistry())
    url = f"http://127.0.0.1:{plugin.port}/metrics"

    def fetch() -> list[str]:
        with urllib.request.urlopen(url, timeout=5) as resp:
            text: str = resp.read().decode()
        return [
            line
            for line in text.splitlines()
            if line.startswith(
                ("lbs_locks_acquired_total", "lbs_locks_released_total", "lbs_held_streams")
            )
        ]

    async def scrape() -> None:
        lines = await asyncio.to_thread(fetch)
        out(f"metrics (lbs-prometheus plugin, scraped over HTTP from {url}):")
        for line in lines:
            out("  " + line)

    return [plugin], scrape
