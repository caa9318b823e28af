"""The fault suite's workload runner: an in-process fleet of lbs clients, a
recorder of every handler run, and the figures every fault test prints.

Each fault test starts its own ``lbs.embedded.RedisServer`` (so it may kill,
restart or SIGSTOP it), runs a :class:`Fleet` of 2-3 ``lbs.Client`` objects
in its event loop (each in ``client.run(handler)`` wrapped in the README's
``try: run() finally: close()``), registers work with ``lbs.Producer``,
injects its fault, waits for the work with bounded polling, and judges the
outcome from what the :class:`Recorder` saw:

* a *run* is one handler call: (stream, consumer, token, entry, retry count,
  start, end, outcome) with ``time.monotonic()`` times, all in this process,
  so runs of different clients are comparable;
* a stream is *finished* when a run of it returned and was not told it
  lost its hold: ``done`` reported ``DONE`` or ``LOCK_EXPIRED`` for that
  run's token (hook ``lbs_lock_released``), or nothing at all (its reply
  was lost: counted as ``done_unknown``; the LBS must still drain, which
  :meth:`Fleet.settle` checks, and a re-run shows as a duplicate);
* a run was *told it lost the lock* when it was cancelled, its token was
  disowned (hook ``lbs_stream_disowned``), or its done said ``LOCK_LOST``;
  two runs of one stream that overlap in time where neither was told are
  "two valid holders at once".

Size: ``LBS_FAULTS=full`` (``make faults``) multiplies streams and durations
by :data:`SCALE`; the default is the smoke size ``make test`` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

import lbs
from lbs.embedded import RedisServer

log = logging.getLogger("lbs.faults")

#: ``smoke`` (``make test``) or ``full`` (``make faults``).
SIZE = os.environ.get("LBS_FAULTS", "smoke")
FULL = SIZE == "full"
#: Streams and durations of the full size, against the smoke size.
SCALE = 10 if FULL else 1
#: How long a test waits for its work to be finished once the fault is over (bounded, generous:
#: recovery takes about a lock TTL); only a failing test waits this long.
SETTLE = 60.0 if FULL else 20.0
#: Per-test limit for pytest-timeout.
TEST_TIMEOUT = 1200 if FULL else 180

HERE = Path(__file__).parent


# ---------------------------------------------------------------- waiting ----


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float, every: float = 0.05, what: str = ""
) -> bool:
    """Poll ``check`` until it is true; False after ``timeout`` seconds (never raises on timeout).

    Redis errors while polling (a server being restarted, a killed
    connection) count as "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return True
        except (RedisError, OSError) as exc:
            log.debug("polling %s: %s", what, exc)
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(every)


#: The binary :func:`server` runs: None for the Redis ``lbs.embedded`` finds; tests/faults/conftest.py
#: sets the valkey-server for a test's ``valkey`` leg.
BINARY: str | None = None


def server(**config: str) -> RedisServer:
    """A fresh redis-server (or valkey-server: :data:`BINARY`) of the test's own (``with server(...) as srv:``).

    Nothing is set on its command line beyond ``config``: in particular not
    ``notify-keyspace-events``, which lbs sets itself with CONFIG SET.
    """
    return RedisServer(BINARY, config=config)


async def crash_and_restart(srv: RedisServer, downtime: float) -> None:
    """``kill -9`` the server, leave it down ``downtime`` seconds, start it again
    on the same port and directory (so an AOF is replayed).

    ``RedisServer`` has no "start again after kill()"; ``restart()`` does it
    once the process is gone: its SHUTDOWN meets a refused connection (which
    it ignores) and it spawns the server again. Called from the main thread
    (the server dies with the thread that started it).
    """
    srv.kill()
    await asyncio.sleep(downtime)
    srv.restart(save=False)


# ------------------------------------------------------------- recording ----


@dataclass(slots=True)
class Run:
    """One handler call."""

    stream: str
    consumer: str  # the fleet's label of the client
    token: int
    entry_id: str
    retry_count: int
    t0: float
    t1: float | None = None
    outcome: str = "running"  # returned | cancelled | raised | running


class Recorder:
    """Every handler run and what the clients reported (a plugin of every client of a fleet)."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self.labels: dict[int, str] = {}  # id(client) -> label
        # Keyed by (label, entry id): a hold (a batch shares its token among its streams).
        self.done: dict[tuple[str, str], lbs.DoneStatus] = {}  # (label, entry id) -> status
        self.disowned: set[tuple[str, str]] = set()
        self.dead_lettered: list[tuple[str, str, str]] = []  # (label, entry id, reason)
        self.handed_back: list[
            tuple[str, str, str, bool, float]
        ] = []  # (label, stream, new id, retry, t)
        self.terminated: list[tuple[str, str]] = []  # (label, error)
        self.started: set[str] = set()
        self.closed: dict[str, float] = {}  # label -> when lbs_client_closed fired

    def label(self, client: Any) -> str:
        return self.labels.get(id(client), "?")

    # -- hooks -------------------------------------------------------------------

    @lbs.hookimpl
    def lbs_client_started(self, client: Any) -> None:
        self.started.add(self.label(client))

    @lbs.hookimpl
    def lbs_client_closed(self, client: Any) -> None:
        self.closed[self.label(client)] = time.monotonic()

    @lbs.hookimpl
    def lbs_lock_released(self, client: Any, entry_id: str, status: lbs.DoneStatus) -> None:
        self.done[(self.label(client), entry_id)] = status

    @lbs.hookimpl
    def lbs_stream_disowned(self, client: Any, entry_id: str) -> None:
        self.disowned.add((self.label(client), entry_id))

    @lbs.hookimpl
    def lbs_stream_dead_lettered(self, client: Any, entry_id: str, reason: str) -> None:
        self.dead_lettered.append((self.label(client), entry_id, reason))

    @lbs.hookimpl
    def lbs_stream_handed_back(
        self, client: Any, stream: str, new_entry_id: str, retry_counted: bool
    ) -> None:
        self.handed_back.append(
            (self.label(client), stream, new_entry_id, retry_counted, time.monotonic())
        )

    @lbs.hookimpl
    def lbs_reader_terminated(self, client: Any, error: BaseException) -> None:
        self.terminated.append((self.label(client), repr(error)))

    # -- the handler ---------------------------------------------------------------

    def handler(
        self, label: str, work: Callable[[lbs.Notification, str], float]
    ) -> Callable[[lbs.Notification], Awaitable[None]]:
        async def handle(note: lbs.Notification) -> None:
            run = Run(
                note.stream, label, note.token, note.entry_id, note.retry_count, time.monotonic()
            )
            self.runs.append(run)
            try:
                await asyncio.sleep(work(note, label))
            except asyncio.CancelledError:
                run.t1, run.outcome = time.monotonic(), "cancelled"
                raise
            except BaseException:
                run.t1, run.outcome = time.monotonic(), "raised"
                raise
            run.t1, run.outcome = time.monotonic(), "returned"

        return handle

    # -- judging -------------------------------------------------------------------

    def status(self, run: Run) -> lbs.DoneStatus | None:
        return self.done.get((run.consumer, run.entry_id))

    def completed(self, run: Run) -> bool:
        """The run returned and was not told it lost its hold (its done said DONE, LOCK_EXPIRED, or nothing)."""
        return run.outcome == "returned" and not self.told(run)

    def told(self, run: Run) -> bool:
        """The run was told it lost the lock (cancelled, disowned, or done said LOCK_LOST)."""
        return (
            run.outcome == "cancelled"
            or (run.consumer, run.entry_id) in self.disowned
            or self.status(run) is lbs.DoneStatus.LOCK_LOST
        )

    def overlaps(self, runs: Iterable[Run], *, valid_only: bool = True) -> list[tuple[Run, Run]]:
        """Pairs of runs of one stream overlapping in time (both valid holders, unless ``valid_only`` is off)."""
        by_stream: dict[str, list[Run]] = {}
        for r in runs:
            if not valid_only or not self.told(r):
                by_stream.setdefault(r.stream, []).append(r)
        out = []
        now = time.monotonic()
        for rs in by_stream.values():
            rs.sort(key=lambda r: r.t0)
            for i, a in enumerate(rs):
                a1 = a.t1 if a.t1 is not None else now
                for b in rs[i + 1 :]:
                    if b.t0 >= a1:
                        break
                    out.append((a, b))
        return out


# ---------------------------------------------------------------- figures ----


@dataclass
class Figures:
    """One fault test's outcome; :meth:`line` is what the test prints."""

    test: str
    registered: int
    handled: int
    finished: int
    faults: int
    lost: int
    duplicated: int
    retries: int
    dead_letters: int
    two_valid_holders: int
    extra: dict[str, Any] = field(default_factory=dict)

    def problems(
        self,
        *,
        lost: bool = True,
        duplicated: bool = True,
        holders: bool = True,
        retries: bool = True,
    ) -> list[str]:
        """The standard checks that failed, one message each (the test adds its own)."""
        out = []
        if lost and self.lost:
            out.append(f"lost={self.lost}: registered streams never finished")
        if duplicated and self.duplicated:
            out.append(
                f"duplicated={self.duplicated}: streams whose handler ran to completion more than once"
            )
        if holders and self.two_valid_holders:
            out.append(
                f"two_valid_holders={self.two_valid_holders}: overlapping runs of one stream, neither told "
                "it lost the lock"
            )
        if retries and self.retries:
            out.append(f"retries={self.retries}: deliveries with retry_count > 0 plus dead letters")
        return out

    def unsettled(self) -> str:
        """Why :meth:`Fleet.settle` timed out."""
        return (
            f"not settled within {SETTLE:.0f}s (every registered stream finished, the LBS empty): "
            f"{self.lost} unfinished, LBS {self.extra.get('lbs_left', '?')} (XLEN/pending)"
        )

    def line(self) -> str:
        head = (
            f"FAULTS {self.test} [{SIZE}]: registered={self.registered} handled={self.handled} "
            f"finished={self.finished} faults={self.faults} lost={self.lost} duplicated={self.duplicated} "
            f"retries={self.retries} (dead letters {self.dead_letters}) "
            f"two_valid_holders={self.two_valid_holders}"
        )
        return head + "".join(f" {k}={v}" for k, v in self.extra.items())


#: The ``report`` fixture: prints a test's figures (and repeats them in the terminal summary).
Report = Callable[[Figures], None]


def default_work(rng: random.Random) -> Callable[[lbs.Notification, str], float]:
    """5-50 ms per stream."""
    return lambda note, label: rng.uniform(0.005, 0.05)


def config(**changes: Any) -> lbs.Config:
    """The suite's client settings: short TTL, quick reads and deadline polls, closes that do not drain."""
    base: dict[str, Any] = dict(
        lock_ttl=2.0,
        read_block=0.1,
        deadline_poll_interval=0.05,
        max_streams=50,
        read_retry_max=1.0,
        drain_timeout=0.0,
    )
    base.update(changes)
    return lbs.Config(**base)


# ------------------------------------------------------------------ fleet ----


class Fleet:
    """2-3 ``lbs.Client`` objects in this event loop, each in ``run(handler)``, plus a producer.

    ``async with Fleet(url, service, ["a", "b"]) as fleet:`` starts them and
    always stops them (close from another task, as an application would).
    """

    def __init__(
        self,
        url: str,
        service: str,
        labels: Iterable[str] = ("a", "b", "c"),
        *,
        cfg: lbs.Config | None = None,
        concurrency: int = 10,
        work: Callable[[lbs.Notification, str], float] | None = None,
        seed: int = 7,
    ) -> None:
        self.url = url
        self.service = service
        self.cfg = cfg or config()
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.work = work or default_work(self.rng)
        self.rec = Recorder()
        self.clients: dict[str, lbs.Client] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._initial = list(labels)
        self.r = aioredis.Redis.from_url(url, socket_timeout=10)  # the test's own look at Redis
        self.producer: lbs.Producer | None = None
        self.registered: dict[str, None] = {}  # in order
        self.uncertain: set[str] = set()  # add_streams failed after sending: maybe registered
        self.register_failures = 0
        self.lbs_key = lbs.input_stream(service)
        self.group = lbs.group_name(service)

    # -- life cycle ------------------------------------------------------------------

    async def __aenter__(self) -> Fleet:
        try:
            for label in self._initial:
                await self.add_client(label)
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def make_client(
        self, label: str, consumer_id: str | None = None, cfg: lbs.Config | None = None
    ) -> lbs.Client:
        client = lbs.Client(
            self.url,
            self.service,
            consumer_id=consumer_id or label,
            config=cfg or self.cfg,
            plugins=[self.rec],
            load_entrypoint_plugins=False,
        )
        self.rec.labels[id(client)] = label
        return client

    async def add_client(
        self, label: str, consumer_id: str | None = None, timeout: float = 20.0
    ) -> lbs.Client:
        """Start one more client in ``run()`` (README pattern: run, and close in a finally)."""
        client = self.make_client(label, consumer_id)
        self.clients[label] = client
        handler = self.rec.handler(label, self.work)

        async def main() -> None:
            try:
                await client.run(handler, concurrency=self.concurrency)
            finally:
                await client.close()

        task = asyncio.create_task(main(), name=f"fleet-{label}")
        self.tasks[label] = task

        async def up() -> bool:
            return label in self.rec.started or task.done()

        if not await eventually(up, timeout, what=f"{label} started"):
            raise AssertionError(f"client {label} did not start within {timeout}s")
        if task.done():
            task.result()  # start() failed: raise it
            raise AssertionError(f"client {label}'s run() returned at once")
        return client

    async def close_client(self, label: str, timeout: float = 30.0) -> None:
        """``close()`` from outside (another task), then wait for its run() task."""
        client, task = self.clients[label], self.tasks[label]
        try:
            await asyncio.wait_for(client.close(), timeout)
        except Exception as exc:
            log.warning("closing %s: %r", label, exc)
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except BaseException as exc:
            log.warning("run() of %s ended with %r", label, exc)

    async def stop(self) -> None:
        """Close every client (concurrently), the producer and the test's connection. Bounded."""
        await asyncio.gather(
            *(self.close_client(label) for label in list(self.clients)), return_exceptions=True
        )
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.producer.close(), 10)
            self.producer = None
        with contextlib.suppress(Exception):
            await self.r.aclose()

    # -- work ------------------------------------------------------------------------

    async def register(self, names: list[str]) -> bool:
        """Register ``names`` with lbs.Producer; True when all were registered.

        A failed batch is not sent again (that could register a name twice):
        its names count as registered where the producer says so
        (``BatchError.entry_ids``), as *uncertain* where it cannot know, and
        an uncertain name counts as registered once a handler has seen it.
        """
        if self.producer is None:
            self.producer = lbs.Producer(self.url, self.service)
        try:
            await self.producer.add_streams(names)
        except Exception as exc:
            self.register_failures += 1
            ids = getattr(exc, "entry_ids", None)
            unknown = set(getattr(exc, "unknown", ()) or ())
            if ids is None or len(ids) != len(names):
                self.uncertain.update(names)
            else:
                for i, name in enumerate(names):
                    if ids[i] is not None:
                        self.registered[name] = None
                    elif i in unknown:
                        self.uncertain.add(name)
            log.info("registering %d streams failed: %r", len(names), exc)
            return False
        for name in names:
            self.registered[name] = None
        return True

    async def feed(self, prefix: str, total: int, duration: float, batch: int = 10) -> list[str]:
        """Register ``total`` streams ``<prefix>-<i>`` in batches spread over ``duration`` seconds."""
        names = [f"{prefix}-{i}" for i in range(total)]
        batches = [names[i : i + batch] for i in range(0, total, batch)]
        start = time.monotonic()
        for k, chunk in enumerate(batches):
            due = start + duration * k / max(1, len(batches))
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            await self.register(chunk)
        return names

    def expected(self, names: Iterable[str] | None = None) -> list[str]:
        """The registered streams (of ``names``): sure ones, and uncertain ones a handler saw."""
        seen = {r.stream for r in self.rec.runs}
        out = list(self.registered) + sorted(n for n in self.uncertain if n in seen)
        if names is not None:
            wanted = set(names)
            out = [n for n in out if n in wanted]
        return out

    def unfinished(self, names: Iterable[str] | None = None) -> list[str]:
        done = {r.stream for r in self.rec.runs if self.rec.completed(r)}
        return [n for n in self.expected(names) if n not in done]

    async def backlog(self) -> tuple[int, int]:
        """(XLEN, pending in the group) of the LBS; (-1, -1) if it cannot be read."""
        try:
            xlen = await self.r.xlen(self.lbs_key)
            try:
                pending = (await self.r.xpending(self.lbs_key, self.group))["pending"]
            except RedisError:
                pending = 0  # no group (yet)
            return int(xlen), int(pending)
        except (RedisError, OSError):
            return -1, -1

    async def settle(
        self, names: Iterable[str] | None = None, timeout: float = 30.0, empty: bool = True
    ) -> bool:
        """Wait until every registered stream (of ``names``) is finished and, with
        ``empty``, the LBS is empty (XLEN and XPENDING 0). False on timeout."""
        wanted = list(names) if names is not None else None

        async def settled() -> bool:
            if self.unfinished(wanted):
                return False
            return not empty or await self.backlog() == (0, 0)

        return await eventually(settled, timeout, every=0.1, what="settle")

    async def dead_letter_entries(self) -> list[dict[bytes, bytes]]:
        try:
            return [f for _, f in await self.r.xrange(lbs.dead_letter_stream(self.service))]
        except (RedisError, OSError):
            return []

    # -- figures ---------------------------------------------------------------------

    async def figures(
        self, test: str, faults: int, *, names: Iterable[str] | None = None, **extra: Any
    ) -> Figures:
        rec = self.rec
        scope = self.expected(names)
        in_scope = set(scope) if names is not None else None
        runs = [r for r in rec.runs if in_scope is None or r.stream in in_scope]
        finished = {r.stream for r in runs if rec.completed(r)}
        returned = Counter(r.stream for r in runs if r.outcome == "returned")
        dead = max(len(rec.dead_lettered), len(await self.dead_letter_entries()))
        statuses = Counter(s.name for r in runs if (s := rec.status(r)) is not None)
        xlen, pending = await self.backlog()
        more = {
            "statuses": dict(statuses),
            "cancelled": sum(1 for r in runs if r.outcome == "cancelled"),
            "disowned": len(rec.disowned),
            "done_unknown": sum(
                1 for r in runs if r.outcome == "returned" and rec.status(r) is None
            ),
            "lbs_left": f"{xlen}/{pending}",
        }
        if self.register_failures:
            more["register_failures"] = self.register_failures
            more["uncertain"] = len(self.uncertain)
        if rec.terminated:
            more["terminated"] = len(rec.terminated)
        more.update(extra)
        return Figures(
            test=test,
            registered=len(scope),
            handled=len(runs),
            finished=sum(1 for n in scope if n in finished),
            faults=faults,
            lost=sum(1 for n in scope if n not in finished),
            duplicated=sum(1 for n, k in returned.items() if k > 1),
            retries=sum(1 for r in runs if r.retry_count > 0) + dead,
            dead_letters=dead,
            two_valid_holders=len(rec.overlaps(runs)),
            extra=more,
        )

    def explain(self, names: Iterable[str] | None = None, limit: int = 3) -> str:
        """What happened to the first few unfinished and duplicated streams (for assertion messages)."""
        rec = self.rec
        lines = []
        for name in self.unfinished(names)[:limit]:
            runs = [r for r in rec.runs if r.stream == name]
            lines.append(
                f"unfinished {name}: " + (", ".join(self.show(r) for r in runs) or "never handled")
            )
        returned = Counter(r.stream for r in rec.runs if r.outcome == "returned")
        for name in [n for n, k in returned.items() if k > 1][:limit]:
            lines.append(
                f"duplicated {name}: "
                + ", ".join(self.show(r) for r in rec.runs if r.stream == name)
            )
        for a, b in rec.overlaps(rec.runs)[:limit]:
            lines.append(f"two valid holders of {a.stream}: {self.show(a)} and {self.show(b)}")
        return "; ".join(lines)

    def show(self, r: Run) -> str:
        status = self.rec.status(r)
        return (
            f"[{r.consumer} token {r.token} retry {r.retry_count} {r.outcome} "
            f"{status.name if status else 'no-done'}"
            f"{' disowned' if (r.consumer, r.entry_id) in self.rec.disowned else ''}]"
        )


# ------------------------------------------------------- worker processes ----


async def read_audit(r: aioredis.Redis, key: str) -> list[dict[str, str]]:
    """Every event of an audit stream (``_deploy_handler.py``), in its order, as str fields."""
    out: list[dict[str, str]] = []
    last = "-"
    while True:
        rows = await r.xrange(key, min=last, max="+", count=10_000)
        if last != "-":
            rows = rows[1:]
        if not rows:
            return out
        for _, fields in rows:
            out.append({k.decode(): v.decode() for k, v in fields.items()})
        last = rows[-1][0].decode()


WORKER = str(HERE / "_sigterm_worker.py")


def spawn_worker(
    url: str, service: str, consumer: str, ttl: float, drain: float, concurrency: int
) -> subprocess.Popen[str]:
    """A consumer process running ``client.run(handler, concurrency=...)`` (see ``_sigterm_worker.py``)."""
    return subprocess.Popen(
        [sys.executable, WORKER, url, service, consumer, str(ttl), str(drain), str(concurrency)],
        stdout=subprocess.PIPE,
        text=True,
    )


async def worker_lines(proc: subprocess.Popen[str], n: int, timeout: float) -> list[dict[str, Any]]:
    """The worker's next ``n`` JSON lines (one per stream it took)."""
    stdout = proc.stdout
    assert stdout is not None
    out: list[dict[str, Any]] = []

    async def read() -> None:
        while len(out) < n:
            line = await asyncio.to_thread(stdout.readline)
            if not line:
                raise AssertionError(f"worker exited with {proc.poll()} after {len(out)} lines")
            out.append(json.loads(line))

    await asyncio.wait_for(read(), timeout)
    return out


def stop_worker(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.asynccontextmanager
async def chaos(
    every: float, action: Callable[[int], Awaitable[None]]
) -> AsyncIterator[Callable[[], int]]:
    """Call ``action(n)`` every ``every`` seconds in a task for the block; yields a count getter."""
    count = 0

    async def loop() -> None:
        nonlocal count
        while True:
            await asyncio.sleep(every)
            await action(count)
            count += 1

    task = asyncio.create_task(loop(), name="chaos")
    try:
        yield lambda: count
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


def verdict(problems: list[str], why: str = "") -> None:
    """Fail with every problem found (not just the first), and what happened to the first few streams."""
    assert not problems, "\n  - ".join(["fault test failed:", *problems]) + (
        f"\n  details: {why}" if why else ""
    )
