"""A fleet on one Redis: K consumer processes of one service and producers in their own processes.

What ``bench_fleet`` measures, kept apart from its pytest rows. :func:`run_fleet` starts the
consumer processes (``multiprocessing``'s forkserver, which has imported lbs and its plugins) and
waits until every one is connected; then, in the measured window, it starts the producers (steady
rates) or just lets the consumers go (a backlog registered beforehand), counts what the consumers
handled through one shared counter each, and takes Redis's CPU and INFO commandstats over the
window (:class:`benchmarks.cost.Window`). A consumer records, for every entry it starts, the time
it started and the time since the producer sent it (``time.perf_counter``, which is the machine's
``CLOCK_MONOTONIC`` on Linux, so the clocks of the processes agree).

The consumers (``SIDES``), each as its users run it:

* ``lbs``: ``lbs.Client(url, service, "c<i>", lbs.Config())`` with the installed plugins, and
  ``run(handler)``; ``lbs-fair-off``: the same with ``Config(fair_dispatch=False)``; ``sharded-<n>``:
  ``lbs.ShardedClient(url, service, "c<i>", lbs.Config(), shards=n)`` (a cluster URL spreads its
  shards over the masters), its producer ``lbs.Producer(url, service, shards=n)``.
* ``keyed``: ``run_keyed(handler)`` with ``Config()``; its producer is ``lbs.Publisher.publish_many``
  spread over 1,000 keys; ``keyed-linger-0``: the same with ``run_keyed(linger=0)`` (a drained key
  let go at once, as before keys lingered); ``keyed-100k``: defaults, over 100,000 keys
  (:data:`KEYED`).
* ``plain``: ``XREADGROUP GROUP g c<i> COUNT 50 BLOCK 1000`` (50: what lbs reads at most with the
  defaults), the handler for each entry, one ``XACK`` of the batch, again.
* ``go``: the Go reference client's per-stream commands done plainly (docs/../GO-CLIENT.md): the same
  read, then per entry ``SET <stream><MUTEX_KEY_SEP><id> <consumer> NX PX 2000`` (pipelined per
  batch), the handler, then ``DEL`` of the batch's mutexes and its ``XACK``, pipelined.

The producers of ``lbs`` and ``lbs-fair-off`` register with ``lbs.Producer.add_streams`` (one
MULTI/EXEC per tick); ``plain`` and ``go`` XADD the same ``lbs-input`` payload in one plain
pipeline per tick (:func:`benchmarks.data.steady`: ticks of 5 ms).

Handlers (``HANDLERS``): ``noop`` records and returns; ``block-<ms>`` holds its process for that
long (``time.sleep``: CPU-bound work, without burning the machine's cores); ``sleep-<ms>`` awaits
that long (I/O-bound work). ``plain`` and ``go`` run a batch's handlers one after the other, as
their loops do; lbs runs them concurrently up to its capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import queue
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

import lbs
from lbs._bench import plain_group
from lbs._redis.connection import resolve_client

from .cost import Cost, Window, combined, percentile
from .data import steady

#: The keyed sides: the keys their producer spreads its messages over, and ``run_keyed``'s
#: ``linger`` (None: its default).
KEYED: dict[str, tuple[int, float | None]] = {
    "keyed": (1_000, None),
    "keyed-linger-0": (1_000, 0.0),
    "keyed-100k": (100_000, None),
    "keyed-100k-linger-0": (100_000, 0.0),
}
#: What the plain and Go loops read at most: lbs's default read size (half of ``Config().max_streams``).
COUNT = lbs.Config().max_streams // 2
#: How long the fleet may take to start, and to finish a backlog, before the run fails.
SLACK = 120.0
#: One producer process per this many registrations a second.
PER_PRODUCER = 20_000
SIDES = ("plain", "go", "lbs", "lbs-fair-off", *KEYED)
#: Processes fork from a server that has imported lbs, redis-py and the plugins once (a spawned
#: process would import them again, a second or two per process on a small machine).
_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["benchmarks.fleet", "lbs_prometheus", "lbs_otel"])


def cores() -> int:
    """The cores this process may run on (what the fleet sizes are read from)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def handler_for(kind: str) -> Callable[[], Awaitable[None]] | None:
    """The work one entry costs: ``noop`` (None), ``block-<ms>`` or ``sleep-<ms>``."""
    if kind == "noop":
        return None
    how, _, ms = kind.partition("-")
    seconds = float(ms) / 1000
    if how == "block":

        async def block() -> None:
            time.sleep(seconds)

        return block
    if how == "sleep":
        return lambda: asyncio.sleep(seconds)
    raise ValueError(f"unknown handler {kind!r}")


@dataclass
class Shared:
    """What the parent and the fleet's processes share."""

    handled: Any  # multiprocessing Array('q'): entries started, one slot per consumer
    ready: Any  # multiprocessing Queue: a consumer's index once it is connected
    go: Any  # multiprocessing Event: start (the window is open)
    stop: Any  # multiprocessing Event: close and report
    results: (
        Any  # multiprocessing Queue: (index, array('d') of started-at and latency pairs, error)
    )
    backlog: bool  # a backlog waits: read nothing before ``go``


@dataclass
class Seen:
    """What one consumer recorded: when it started each entry, and that entry's latency (seconds)."""

    started: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)

    def add(self, sent: Any) -> None:
        now = time.perf_counter()
        if sent is not None:
            self.started.append(now)
            self.latency.append(now - float(sent))

    def packed(self) -> bytes:
        out = array("d", self.started)
        out.extend(self.latency)
        return out.tobytes()


# -- consumers ------------------------------------------------------------------------------------


async def _lbs(
    url: str, service: str, i: int, kind: str, sh: Shared, fair: bool, shards: int = 0
) -> Seen:
    seen, work = Seen(), handler_for(kind)

    async def handle(note: lbs.Notification) -> None:
        seen.add(note.info.get("t") if isinstance(note.info, dict) else None)
        sh.handled[i] += 1
        if work is not None:
            await work()

    if shards:
        sc = lbs.ShardedClient(url, service, f"c{i}", lbs.Config(), shards=shards)
        await _serve(url, i, sh, sc, lambda: sc.run(handle))
        return seen
    c = lbs.Client(url, service, f"c{i}", lbs.Config(fair_dispatch=fair))
    await _serve(url, i, sh, c, lambda: c.run(handle, handle_signals=False))
    return seen


async def _keyed(
    url: str, service: str, i: int, kind: str, sh: Shared, linger: float | None
) -> Seen:
    seen, work = Seen(), handler_for(kind)
    options = {} if linger is None else {"linger": linger}

    async def handle(batch: lbs.KeyedBatch) -> None:
        for m in batch.messages:
            seen.add(m.fields.get("t"))
            sh.handled[i] += 1
            if work is not None:
                await work()

    c = lbs.Client(url, service, f"c{i}", lbs.Config())
    await _serve(url, i, sh, c, lambda: c.run_keyed(handle, handle_signals=False, **options))
    return seen


async def _serve(
    url: str,
    i: int,
    sh: Shared,
    c: lbs.Client | lbs.ShardedClient,
    run: Callable[[], Awaitable[None]],
) -> None:
    """Start ``c``, ``run()`` it until the parent says stop, then close it."""
    await _ready(url, i, sh, c.start)
    runner = asyncio.create_task(run())
    await _until_stopped(sh, runner)
    await c.close()
    await runner


async def _loop(url: str, service: str, i: int, kind: str, sh: Shared, go_mutex: bool) -> Seen:
    """The plain loop, or (``go_mutex``) the Go client's per-stream commands around it."""
    seen, work = Seen(), handler_for(kind)
    r = aioredis.Redis.from_url(url)
    stream, group = await plain_group(r, service)
    me = f"c{i}"
    await _ready(url, i, sh, r.ping)

    async def consume() -> None:
        while not sh.stop.is_set():
            reply: Any = await r.xreadgroup(group, me, {stream: ">"}, count=COUNT, block=1000)
            entries = [e for _, es in reply or [] for e in es]
            if not entries:
                continue
            ids = [entry_id for entry_id, _ in entries]
            inputs = [lbs.decode_input(fields[b"lbs-input"]) for _, fields in entries]
            mutexes: list[bytes] = []
            if go_mutex:
                pipe = r.pipeline(transaction=False)
                for entry_id, (name, _) in zip(ids, inputs):
                    mutexes.append(name.encode() + b"<MUTEX_KEY_SEP>" + entry_id)
                    pipe.set(mutexes[-1], me, nx=True, px=2000)
                await pipe.execute()
            for _, info in inputs:
                seen.add(info.get("t") if isinstance(info, dict) else None)
                sh.handled[i] += 1
                if work is not None:
                    await work()
            pipe = r.pipeline(transaction=False)
            if mutexes:
                pipe.delete(*mutexes)
            pipe.xack(stream, group, *ids)
            await pipe.execute()

    consumer = asyncio.create_task(consume())
    await _until_stopped(sh, consumer)
    # Blocked in XREADGROUP: cancelling drops its connection, which ends the BLOCK. redis-py may
    # turn the cancellation into a reconnect, so the loop also ends by itself once stopped.
    consumer.cancel()
    await asyncio.gather(consumer, return_exceptions=True)
    await r.aclose()
    return seen


async def _ready(url: str, i: int, sh: Shared, start: Callable[[], Awaitable[Any]]) -> None:
    """Start (connect, create the group, start reading) and say so. With a backlog waiting, say so
    once connected and start when the window opens instead: nothing is read before it."""
    if sh.backlog:
        r, _ = resolve_client(url)  # a redis+cluster:// URL too
        await r.ping()
        await r.aclose()
        sh.ready.put(i)
        await asyncio.get_running_loop().run_in_executor(None, sh.go.wait)
        await start()
    else:
        await start()
        sh.ready.put(i)


async def _until_stopped(sh: Shared, task: asyncio.Task[Any]) -> None:
    while not sh.stop.is_set():
        if task.done():
            task.result()  # a consumer that died fails the run with its own error
            raise RuntimeError("the consumer stopped by itself")
        await asyncio.sleep(0.05)


def _consumer_main(side: str, url: str, service: str, i: int, kind: str, sh: Shared) -> None:
    sharded = {side: lambda: _lbs(url, service, i, kind, sh, True, shards_of(side))}
    runs: dict[str, Callable[[], Awaitable[Seen]]] = {
        "lbs": lambda: _lbs(url, service, i, kind, sh, True),
        "lbs-fair-off": lambda: _lbs(url, service, i, kind, sh, False),
        **{k: (lambda k=k: _keyed(url, service, i, kind, sh, KEYED[k][1])) for k in KEYED},
        **(sharded if side.startswith("sharded-") else {}),
        "plain": lambda: _loop(url, service, i, kind, sh, False),
        "go": lambda: _loop(url, service, i, kind, sh, True),
    }
    try:
        seen = asyncio.run(runs[side]())
    except BaseException as exc:  # the parent fails the run with it
        sh.results.put((i, b"", f"{type(exc).__name__}: {exc}"))
        raise
    sh.results.put((i, seen.packed(), None))


# -- producers ------------------------------------------------------------------------------------


def shards_of(side: str) -> int:
    """A ``sharded-<n>`` side's shard count (1 for the unsharded ``lbs`` sides)."""
    return int(side.removeprefix("sharded-")) if side.startswith("sharded-") else 1


def publisher(side: str, url: str, service: str) -> tuple[Any, Callable[[Any], Awaitable[Any]]]:
    """``(closeable, publish)``: how ``side``'s producer sends a batch of ``(name, info)``."""
    if side in ("lbs", "lbs-fair-off") or side.startswith("sharded-"):
        p = lbs.Producer(url, service, shards=shards_of(side))
        return p, p.add_streams
    if side in KEYED:
        pub, keys = lbs.Publisher(url, service), KEYED[side][0]

        async def publish_keyed(batch: list[tuple[str, dict[str, Any]]]) -> Any:
            return await pub.publish_many([(f"key-{int(n[1:]) % keys}", i) for n, i in batch])

        return pub, publish_keyed
    r = aioredis.Redis.from_url(url)
    stream = lbs.input_stream(service)

    async def publish_plain(batch: list[tuple[str, dict[str, Any]]]) -> Any:
        pipe = r.pipeline(transaction=False)
        for name, info in batch:
            pipe.xadd(stream, {"lbs-input": lbs.encode_input(name, info)})
        return await pipe.execute()

    return r, publish_plain


async def _produce(
    side: str, url: str, service: str, rate: float, seconds: float, tick: float, sh: Shared
) -> int:
    closeable, publish = publisher(side, url, service)
    await asyncio.get_running_loop().run_in_executor(None, sh.go.wait)
    try:
        return await steady(publish, rate, seconds, tick)
    finally:
        close = getattr(closeable, "aclose", None) or closeable.close
        await close()


def _producer_main(
    side: str,
    url: str,
    service: str,
    rate: float,
    seconds: float,
    tick: float,
    sh: Shared,
    out: Any,
) -> None:
    try:
        out.put((asyncio.run(_produce(side, url, service, rate, seconds, tick, sh)), None))
    except BaseException as exc:
        out.put((0, f"{type(exc).__name__}: {exc}"))
        raise


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Result:
    """One run of a fleet."""

    consumers: int
    #: Registrations (messages) offered in the window; for a backlog, its size.
    offered: int
    #: Started by the consumers when the window closed.
    handled: int
    #: Redis's cost over the window (every server measured, together).
    cost: Cost
    #: The latencies (seconds) of the entries started in the window, sorted.
    latencies: list[float]
    #: Each measured server's own cost (``run_fleet``'s ``servers``, in order).
    costs: list[Cost] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        """The row's ``extra_info`` (see ``bench_fleet``)."""
        ms = [x * 1000 for x in self.latencies]
        n = max(1, self.handled)
        out: dict[str, Any] = {
            "consumers": self.consumers,
            "messages": self.handled,
            "handled_per_s": round(self.handled / self.cost.seconds, 1),
            "backlog": self.offered - self.handled,
            "redis_cpu_pct": round(self.cost.cpu / self.cost.seconds * 100, 1),
            "redis_cpu_us_per_message": round(self.cost.cpu / n * 1e6, 2),
        }
        if ms:
            out["p50_ms"] = round(percentile(ms, 0.5), 2)
            out["p99_ms"] = round(percentile(ms, 0.99), 2)
        out["commands_per_message"] = self.cost.per(n)
        out["window_s"] = round(self.cost.seconds, 2)
        return out


async def run_fleet(
    url: str,
    service: str,
    side: str,
    consumers: int,
    *,
    handler: str = "noop",
    rate: float = 0.0,
    seconds: float = 0.0,
    tick: float = 0.005,
    backlog: int = 0,
    settle: float = 0.5,
    grace: float = 1.0,
    servers: Sequence[str] = (),
) -> Result:
    """Run ``consumers`` processes of ``side``: either producers send ``rate`` a second for
        ``seconds`` in ticks of ``tick`` seconds (1 s: a burst of ``rate`` once a second), and the window
        closes when all is started or ``grace`` seconds after the last send; or a ``backlog`` is already
        registered, and the window closes when all of it is started. ``servers``: the URLs of the servers
    whose cost is taken (every master of a cluster; default ``url``)."""
    sh = Shared(
        _CTX.Array("q", consumers, lock=False),
        _CTX.Queue(),
        _CTX.Event(),
        _CTX.Event(),
        _CTX.Queue(),
        backlog > 0,
    )
    procs = [
        _CTX.Process(target=_consumer_main, args=(side, url, service, i, handler, sh), daemon=True)
        for i in range(consumers)
    ]
    produced: Any = _CTX.Queue()
    producers = 0 if backlog else max(1, math.ceil(rate / PER_PRODUCER))
    procs += [
        _CTX.Process(
            target=_producer_main,
            args=(side, url, service, rate / producers, seconds, tick, sh, produced),
            daemon=True,
        )
        for _ in range(producers)
    ]
    admins = [aioredis.Redis.from_url(u) for u in servers or [url]]
    try:
        for p in procs:
            p.start()
        for _ in range(consumers):
            await _get(sh.ready, "a consumer to connect", procs)
        await asyncio.sleep(settle)  # every lbs consumer has read and waits in its read_block
        windows = [await Window.open(admin) for admin in admins]
        sh.go.set()
        if backlog:
            offered = backlog
            await _wait(lambda: sum(sh.handled) >= backlog, SLACK, procs, "the backlog to drain")
        else:
            offered = 0
            for _ in range(producers):
                sent, error = await _get(produced, "a producer to finish", procs)
                if error:
                    raise RuntimeError(f"a producer failed: {error}")
                offered += sent
            with contextlib.suppress(TimeoutError):
                await _wait(lambda: sum(sh.handled) >= offered, grace, procs, "")
        costs = [await window.close() for window in windows]
        handled = sum(sh.handled)
        closed_at = time.perf_counter()
        sh.stop.set()
        latencies: list[float] = []
        for _ in range(consumers):
            i, packed, error = await _get(sh.results, "a consumer to report", procs)
            if error:
                raise RuntimeError(f"consumer c{i} failed: {error}")
            values = array("d")
            values.frombytes(packed)
            half = len(values) // 2
            latencies.extend(
                lat for at, lat in zip(values[:half], values[half:]) if at <= closed_at
            )
        latencies.sort()
        return Result(consumers, offered, min(handled, offered), combined(costs), latencies, costs)
    finally:
        sh.go.set()
        sh.stop.set()
        for p in procs:
            await asyncio.get_running_loop().run_in_executor(None, p.join, 30)
            if p.is_alive():
                p.kill()
        for admin in admins:
            await admin.aclose()


async def _get(q: Any, what: str, procs: Sequence[Any]) -> Any:
    deadline = time.monotonic() + SLACK
    while True:
        try:
            return q.get_nowait()
        except queue.Empty:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {SLACK} s")
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead and q.empty():
            raise RuntimeError(f"a fleet process died (exit {dead[0].exitcode}) waiting for {what}")
        await asyncio.sleep(0.01)


async def _wait(done: Callable[[], bool], limit: float, procs: Sequence[Any], what: str) -> None:
    deadline = time.monotonic() + limit
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {limit} s: {what}")
        if any(p.exitcode not in (None, 0) for p in procs):
            raise RuntimeError(f"a fleet process died waiting for {what}")
        await asyncio.sleep(0.002)
