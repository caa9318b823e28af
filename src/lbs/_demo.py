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

Every key the demo writes is one of its service's (:func:`demo_keys`): the
LBS ``<service>-input``, the keys under its hash tag ``{<service>-input}:``
(the data streams among them, ``{<service>-input}:session-1`` ...) and its
locks ``lock:{<service>-input}:*``, and the same for the keyed scenario's
service ``<service>-tickets``. :func:`run_demo` refuses to start
(:class:`ServiceInUseError`) when any such key exists, so it never writes
into, or deletes, anyone else's data, and deletes every one of them at the
end, whatever happened.

``python -m lbs._demo doomed URL SERVICE`` is the consumer that gets killed;
``python -m lbs._demo spark URL SERVICE`` is step 1's Spark job.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from _lbscore import try_decode_input

from . import _keys
from ._demo_keyed import KeyedResult, keyed_service, run_keyed_demo
from .client import Client, Handler
from .config import Config
from .exceptions import ConfigurationError, RedisOperationError, ServerError
from .notifications import Notification
from .producer import Producer

Printer = Callable[[str], None]
#: Told what a long step is doing (a status line, shown with a spinner), or None when it is over.
Progress = Callable[[str | None], None]

#: The demo's poison pill is dead-lettered after this many failed attempts.
POISON_MAX_RETRIES = 2
#: The killed consumer's lock TTL: how long its stream stays locked after SIGKILL.
CRASH_LOCK_TTL = 1.0
#: The Spark job's master: a local Spark with two worker threads.
SPARK_MASTER = "local[2]"
#: How long the Spark job may take, session start included (a busy 2-core machine is slow).
SPARK_TIMEOUT = 600.0
#: How long the Spark job takes, session start included, measured on a 2-core machine: 22-45 s
#: beside nothing, two busy processes or the team's work, up to 60 s seen under more (what the user is told).
SPARK_JOB_TIME = "20-60 s"
#: The oldest Redis the demo runs on (with --redis-url); lbs's fallbacks cover 7.x.
MIN_REDIS = (7, 0)

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
            self.tickets is not None
            and self.tickets.ok
            and sum(self.processed.values()) == self.registered
            and self.dead_letters == 2
            and self.crash_recovery_s >= 0
            and self.poison_retries == POISON_MAX_RETRIES + 1
            and self.leftover_pending == 0
            and self.leftover_entries == 0
            and self.leftover_locks == 0
        )


class ServiceInUseError(ConfigurationError):
    """Raised when the Redis the demo is to run on already has keys of its service: the demo writes
    and deletes only keys of a service of its own, so it refuses to start."""


def data_stream(service: str, name: str) -> str:
    """The demo's data stream ``name``: ``{<service>-input}:<name>``, under the service's hash tag."""
    return f"{_keys.hash_tag(service)}:{name}"


def demo_keys(service: str) -> tuple[list[str], list[str]]:
    """What the demo writes with ``service``: ``(names, prefixes)``.

    Every key it writes is one of ``names`` (the two LBS streams) or starts
    with one of ``prefixes`` (the services' hash tags and locks), for
    ``service`` and for the keyed scenario's ``<service>-tickets``.
    """
    services = [service, keyed_service(service)]
    names = [_keys.input_stream(s) for s in services]
    prefixes = [p for s in services for p in (_keys.key_prefix(s), _keys.lock_key(s, ""))]
    return names, prefixes


def describe_keys(service: str) -> str:
    """The demo's keys as glob patterns, for messages."""
    return (
        f"{_keys.input_stream(service)}, {_keys.key_prefix(service)}*, {_keys.lock_key(service, '*')} "
        f"and the same for {keyed_service(service)}"
    )


async def find_demo_keys(r: aioredis.Redis, service: str) -> list[str]:
    """Every key in ``r`` that the demo with ``service`` would write (sorted), in one SCAN."""
    names, prefixes = demo_keys(service)
    found = {n for n in names if await r.exists(n)}
    # Every prefix holds "{<service>-"; the SCAN match narrows by it, the check here is exact.
    tag = "{" + _glob_escape(service) + "-"
    async for raw in r.scan_iter(match=f"*{tag}*", count=10_000):
        key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if key.startswith(tuple(prefixes)):
            found.add(key)
    return sorted(found)


def _glob_escape(text: str) -> str:
    """``text`` with the characters special in Redis's glob patterns backslash-escaped."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


async def check_server(r: aioredis.Redis, service: str) -> None:
    """Refuse to start unless ``r`` is reachable, runs Redis >= :data:`MIN_REDIS` and holds no key of the demo's.

    Raises :class:`RedisOperationError` (unreachable), :class:`ServerError`
    (too old) or :class:`ServiceInUseError` (keys of ``service`` exist).
    """
    try:
        info = await r.info("server")
        found = await find_demo_keys(r, service)
    except RedisError as exc:
        raise RedisOperationError("reaching Redis", exc) from exc
    version = tuple(int(p) for p in str(info["redis_version"]).split(".")[:2])
    if version < MIN_REDIS:
        raise ServerError(
            f"the demo needs Redis >= {'.'.join(map(str, MIN_REDIS))}; "
            f"this one is {info['redis_version']}"
        )
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ServiceInUseError(
            f"this Redis already has keys that the demo with service {service!r} would write and delete "
            f"({shown}; its keys are {describe_keys(service)}): pick another --service"
        )


async def delete_demo_keys(r: aioredis.Redis, service: str) -> int:
    """Delete every key of the demo's with ``service``; how many there were."""
    found = await find_demo_keys(r, service)
    for i in range(0, len(found), 500):
        await r.delete(*found[i : i + 500])
    return len(found)


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
    result = DemoResult()
    r = aioredis.Redis.from_url(url)
    try:
        await check_server(r, service)
    except BaseException:
        await r.aclose()
        raise
    # max_streams=2 so the demo's handful of streams spreads over both consumers; drain_timeout=0 so the
    # consumer that shuts down mid-stream (step 3) hands its running streams back at once.
    config = Config(
        lock_ttl=30.0,
        read_block=0.1,
        max_streams=2,
        max_retries=POISON_MAX_RETRIES,
        drain_timeout=0.0,
    )
    prefix = data_stream(service, "")
    names = [data_stream(service, f"session-{i + 1}") for i in range(streams)]
    late = [data_stream(service, f"late-{i + 1}") for i in range(2)]
    every_name = names + late
    crash, poison = data_stream(service, "crash-1"), data_stream(service, "poison-1")
    all_done = asyncio.Event()
    finished_at: dict[str, float] = {}
    clients: list[Client] = []
    try:
        out(
            f"keys: the demo writes only {describe_keys(service)} (data streams {prefix}session-1 ...), "
            f"and deletes them at the end"
        )
        # The events of each data stream, for the consumers to read: one row per event.
        rows: list[Row] = [
            (name, n * 10 + e, f"u{n}") for n, name in enumerate(every_name) for e in range(events)
        ]
        first, later = (
            [row for row in rows if row[0] in names],
            [row for row in rows if row[0] in late],
        )
        lbs_key = _keys.input_stream(service)
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
            timings = await _spark_write(url, service, first, progress)
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
            async with Producer(r, service) as producer:
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

        def handler_for(consumer: str, slow: asyncio.Event | None = None) -> Handler:
            async def handle(note: Notification) -> None:
                short = note.stream.removeprefix(prefix)
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
                finished_at[note.stream] = time.perf_counter()
                out(
                    f"{consumer}: {note.stream} (token {note.token}, user {user}) -> "
                    f"{len(events_)} events, sum {total}; done"
                )
                if sum(result.processed.values()) >= result.registered:
                    all_done.set()

            return handle

        started = time.perf_counter()
        a_busy = asyncio.Event()
        runners = []
        metrics, scrape = _metrics_plugin(out)
        for n in range(consumers):
            consumer = f"consumer-{chr(97 + n)}"
            client = Client(
                r,
                service,
                consumer_id=consumer,
                config=config,
                plugins=metrics,
                load_entrypoint_plugins=False,
            )
            clients.append(client)
            runners.append(
                asyncio.create_task(client.run(handler_for(consumer, a_busy if n == 0 else None)))
            )
        await asyncio.wait_for(all_done.wait(), timeout=30)
        out(
            f"all {result.registered} data streams processed in {time.perf_counter() - started:.2f}s "
            f"({', '.join(f'{c} {n}' for c, n in sorted(result.processed.items()))})"
        )
        if scrape is not None:
            await scrape()

        deadline = time.monotonic() + 10
        while not await r.exists(_keys.dead_letter_stream(service)) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        dlq: list[tuple[bytes, dict[bytes, bytes]]] = await r.xrange(  # type: ignore[assignment]
            _keys.dead_letter_stream(service)
        )
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
        b = Client(
            r, service, consumer_id="consumer-b", config=config, load_entrypoint_plugins=False
        )
        clients.append(b)
        runners.append(asyncio.create_task(b.run(handler_for("consumer-b"))))
        await asyncio.wait_for(all_done.wait(), timeout=30)
        result.hand_back_pickup_ms = (max(finished_at[n] for n in late) - closed_at) * 1000
        out(
            f"consumer-b finished them {result.hand_back_pickup_ms:.0f} ms later "
            f"(the lock TTL is {config.lock_ttl:.0f} s: nobody waited for it)"
        )

        for each in clients:
            await each.close()
        await asyncio.gather(*runners)

        # Crash: a consumer in another process takes a stream, then dies with SIGKILL.
        all_done.clear()
        result.registered += 1
        async with Producer(r, service) as producer:
            await producer.add_stream(crash, {"user": "u-crash"})
        doomed = subprocess.Popen(
            [sys.executable, "-m", "lbs._demo", "doomed", url, service],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert doomed.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(doomed.stdout.readline), timeout=30)
            if not line:
                raise RuntimeError(
                    f"the doomed consumer exited with {doomed.wait()} before taking a stream"
                )
            held_note = json.loads(line)
            doomed.kill()
            killed_at = time.perf_counter()
            out(
                f"consumer-x (pid {doomed.pid}) took {held_note['stream']} (token {held_note['token']}, "
                f"lock TTL {CRASH_LOCK_TTL:.0f} s) and was killed with SIGKILL"
            )
        finally:
            doomed.kill()
            doomed.wait()
            if doomed.stdout:
                doomed.stdout.close()
        c = Client(
            r, service, consumer_id="consumer-c", config=config, load_entrypoint_plugins=False
        )
        clients.append(c)
        runners.append(asyncio.create_task(c.run(handler_for("consumer-c"))))
        await asyncio.wait_for(all_done.wait(), timeout=30)
        result.crash_recovery_s = finished_at[crash] - killed_at
        paths = {
            k.split("_")[1]: int(v)
            for k, v in c.metrics.items()
            if k.endswith("_requeued_total") and v
        }
        out(
            f"consumer-c's recovery re-queued {crash} once its lock had expired ({paths}); consumer-c "
            f"finished it {result.crash_recovery_s:.2f} s after the kill"
        )

        # Poison pill: its handler fails every time; after max_retries it is a dead letter.
        async with Producer(r, service) as producer:
            await producer.add_stream(poison, {"user": "u-poison"})
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
        out(
            f"dead letter: {poison} after {result.poison_retries} failed attempts "
            f"(max_retries {POISON_MAX_RETRIES}): {pill[b'_reason'].decode()}; "
            f"original entry {pill[b'_original_id'].decode()}"
        )

        await c.close()
        await asyncio.gather(*runners)
        stream, group = _keys.input_stream(service), _keys.group_name(service)
        result.leftover_pending = (await r.xpending(stream, group))["pending"]
        result.leftover_entries = await r.xlen(stream)
        result.leftover_locks = len(
            [k async for k in r.scan_iter(match=_keys.lock_key(service, "*"))]
        )
        out(
            f"left behind: {result.leftover_pending} pending, {result.leftover_entries} LBS entries, "
            f"{result.leftover_locks} locks; {result.dead_letters} dead letters"
        )

        # Keyed, ordered processing: tickets whose events go one by one, in order, across a kill.
        result.tickets = await run_keyed_demo(url, keyed_service(service), out)
    finally:
        try:
            for each in clients:
                await each.close()
            # Whatever happened: nothing of the demo's stays (no other key existed under these names).
            removed = await delete_demo_keys(r, service)
            out(
                f"cleaned up: deleted the demo's {removed} keys ({describe_keys(service)}); nothing else was touched"
            )
        finally:
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


async def _spark_write(
    url: str, service: str, rows: list[Row], progress: Progress | None = None
) -> dict[str, float]:
    """Run :func:`_spark_job` in a child process; return its timings (seconds), ``total_s`` included.

    A child process keeps Spark's JVM, its start-up chatter on stderr and its
    threads out of the demo's process; the JVM exits with it. The child says
    on stdout what it is doing (one JSON object a line, ``{"stage": ...}``),
    and ``progress`` hears it with the time so far, every half second.
    """
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "lbs._demo",
        "spark",
        url,
        service,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    stdout: asyncio.StreamReader = proc.stdout
    stage = "starting the JVM and a local Spark session"
    reports: list[dict[str, float]] = []

    async def read_reports() -> None:
        nonlocal stage
        async for raw in stdout:
            try:
                report = json.loads(raw)
            except ValueError:
                continue  # not one of ours (a library's print)
            if "stage" in report:
                stage = str(report["stage"])
            else:
                reports.append(report)

    reader, errors = asyncio.create_task(read_reports()), asyncio.create_task(proc.stderr.read())
    exited = asyncio.create_task(proc.wait())
    stderr = b""
    try:
        proc.stdin.write(json.dumps(rows).encode())
        await proc.stdin.drain()
        proc.stdin.close()
        while not exited.done():
            elapsed = time.perf_counter() - started
            if elapsed > SPARK_TIMEOUT:
                raise RuntimeError(f"the Spark job did not finish within {SPARK_TIMEOUT:.0f} s")
            if progress is not None:
                # The time first: a narrow terminal cuts the end of the line.
                progress(f"spark {elapsed:.0f} s (takes {SPARK_JOB_TIME}): {stage}")
            await asyncio.wait((exited,), timeout=0.5)
        await asyncio.wait(
            (reader, errors), timeout=30
        )  # the pipes are at EOF once the child has exited
        stderr = errors.result() if errors.done() else b""
    finally:
        if progress is not None:
            progress(None)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for task in (reader, errors, exited):
            task.cancel()
    if proc.returncode != 0 or not reports:
        tail = "\n".join(stderr.decode(errors="replace").strip().splitlines()[-20:])
        raise RuntimeError(f"the Spark job exited with {proc.returncode}:\n{tail}")
    timings = reports[-1]
    timings["total_s"] = time.perf_counter() - started
    return timings


def _spark_job(url: str, service: str, rows: list[Row]) -> dict[str, float]:
    """Step 1's Spark job: write ``rows`` with the lbs sink, stop the session; return the timings.

    Says what it is doing on stdout as it goes (``{"stage": ...}`` lines), for :func:`_spark_write`.
    """
    from .spark import local_session

    def stage(text: str) -> None:
        print(json.dumps({"stage": text}), flush=True)

    started = time.perf_counter()
    spark = local_session(SPARK_MASTER, app_name="lbs-demo")
    ready = time.perf_counter()
    try:
        stage(f"writing {len(rows)} rows with the lbs sink (session up in {ready - started:.0f} s)")
        df = spark.createDataFrame(rows, "stream string, value long, user string")
        df.write.format("lbs").option("url", url).option("service", service).mode("append").save()
        written = time.perf_counter()
        stage("written; stopping Spark")
    finally:
        spark.stop()
    return {"start_s": ready - started, "write_s": written - ready}


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
    if len(sys.argv) != 4 or sys.argv[1] not in ("doomed", "spark"):
        sys.exit("usage: python -m lbs._demo {doomed,spark} URL SERVICE")
    if sys.argv[1] == "spark":
        rows_in = [(str(s), int(v), str(u)) for s, v, u in json.load(sys.stdin)]
        print(json.dumps(_spark_job(sys.argv[2], sys.argv[3], rows_in)), flush=True)
    else:
        asyncio.run(_doomed(sys.argv[2], sys.argv[3]))
