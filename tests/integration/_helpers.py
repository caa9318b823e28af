"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import lbs
from lbs._keys import (
    consumers_key,
    dead_letter_stream,
    delayed_stream,
    due_key,
    group_name,
    input_stream,
    lease_prefix,
    reaped_key,
)
from lbs._redis import scripts
from lbs._redis.scripts import source


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 10.0, every: float = 0.02
) -> None:
    """Poll Redis state until ``check`` is true; fail after ``timeout`` seconds.

    For state that no event announces (a key's expiry, a pending count);
    notifications are awaited directly instead.
    """
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {check}")
        await asyncio.sleep(every)


def requeue_keys(service: str) -> list[str]:
    """``requeue-6.lua``'s KEYS[1..5] for ``service`` (no pardons: KEYS[6] left out)."""
    return [
        input_stream(service),
        dead_letter_stream(service),
        lease_prefix(service),
        delayed_stream(service),
        due_key(service),
    ]


def requeue_switches(
    service: str, consumer: str, max_retries: int = 5, dead_letter_on: bool = True, **more: Any
) -> str:
    """``requeue-6.lua``'s packed switches (ARGV[1]) for ``consumer`` of ``service``: lbs's default
    field names; ``more``: the other :func:`lbs._redis.scripts.requeue_options` (key prefixes, Go)."""
    return scripts.requeue_options(
        group=group_name(service),
        max_retries=max_retries,
        retry_field="_retry_count",
        original_field="_original_id",
        consumer=consumer,
        dead_letter_on=dead_letter_on,
        field_prefix="_",
        **more,
    )


async def reap(r: Any, service: str, tokens_prefix: str = "") -> list[Any]:
    """One ``reap-3.lua`` call by its source (100 entries at most, stall threshold 60 s, grace 1 s):
    ``[gone, next_ms]``, plus ``holders, deadlines`` once some consumer was due (the stamp it wrote,
    its reply's third element, checked against the key and left out)."""
    reply = await r.eval(
        source("reap-3"),
        3,
        consumers_key(service),
        input_stream(service),
        reaped_key(service),
        group_name(service),
        lease_prefix(service),
        100,
        60_000,
        1_000,
        tokens_prefix,
    )
    if isinstance(reply, list) and len(reply) >= 3:
        assert reply[2] == await r.get(reaped_key(service))
        del reply[2]
    return reply  # type: ignore[no-any-return]


async def is_true(value: bool) -> bool:
    """``value`` as an awaitable, so ``eventually`` can poll a plain condition:
    ``await eventually(lambda: is_true(c.held == 2))``."""
    return value


async def take(
    client: lbs.Client,
    n: int,
    timeout: float = 10.0,
    kind: lbs.NotificationType = lbs.NotificationType.STREAM_ADDED,
) -> list[lbs.Notification]:
    """The next ``n`` notifications of ``kind`` (others are skipped)."""
    out: list[lbs.Notification] = []

    async def collect() -> None:
        async for note in client.notifications():
            if note.type is kind:
                out.append(note)
                if len(out) == n:
                    return

    await asyncio.wait_for(collect(), timeout)
    return out


def client(
    url: Any,
    service: str,
    consumer: str = "c1",
    *,
    plugins: Iterable[object] = (),
    **config: object,
) -> lbs.Client:
    """A client with test-friendly defaults: short blocks, no drain, no entry-point plugins.

    ``url`` is anything ``lbs.Client`` takes (a URL, a redis-py or cluster client);
    ``plugins`` are registered as given, ``config`` goes to ``lbs.Config``.
    """
    config.setdefault("read_block", 0.1)
    # Tests close clients whose handlers wait for ever: handed back at once unless a test drains.
    config.setdefault("drain_timeout", 0.0)
    return lbs.Client(
        url,
        service,
        consumer_id=consumer,
        config=lbs.Config(**config),  # type: ignore[arg-type]
        plugins=plugins,
        load_entrypoint_plugins=False,
    )


async def produce(url: str, service: str, *names: str) -> list[str]:
    """Register data streams through a short-lived producer."""
    async with lbs.Producer(url, service) as producer:
        return await producer.add_streams(names)


async def next_line(proc: subprocess.Popen[str], timeout: float = 20) -> dict[str, Any]:
    """The next JSON line a child process printed; fails if it ended first."""
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout)
    assert line, f"the process ended early (exit code {proc.poll()})"
    return json.loads(line)  # type: ignore[no-any-return]


async def group_has(r: Any, service: str, n: int) -> bool:
    """Whether ``service``'s group has ``n`` consumers (False while the group does not exist)."""
    try:
        return len(await r.xinfo_consumers(input_stream(service), group_name(service))) == n
    except Exception:
        return False


@contextlib.asynccontextmanager
async def consumer_processes(
    script: str,
    url: str,
    service: str,
    n: int,
    seen: Callable[[dict[str, Any]], None],
    *more: str,
) -> AsyncIterator[None]:
    """``n`` processes ``python -c SCRIPT URL SERVICE c<i> MORE...`` (``i`` from 0) for the block,
    each JSON line they print handed to ``seen``. On the way out their stdin is closed (a consumer
    process closes its client and ends then), each is waited for (60 s at most) and its output read
    to the end."""
    procs = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-c", script, url, service, f"c{i}", *more),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(n)
    ]

    async def collect(proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            seen(json.loads(line))

    readers = [asyncio.create_task(collect(p)) for p in procs]
    try:
        yield
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
        for p in procs:
            await asyncio.wait_for(p.wait(), 60)
        await asyncio.gather(*readers)


async def command_calls(r: Any) -> dict[str, int]:
    """Calls per command so far on ``r``'s server (``INFO commandstats``), by lower-case name."""
    stats = await r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


class Hold:
    """A ``run()`` handler that records each call's notification; streams whose name starts with
    ``prefix`` ("": every one) wait until :attr:`go` is set, or their handler is cancelled
    (:attr:`cancelled`: their entry ids)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.calls: list[lbs.Notification] = []
        self.cancelled: list[str] = []
        self.go = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, note: lbs.Notification) -> None:
        self.calls.append(note)
        self.started.set()
        if note.stream.startswith(self.prefix):
            try:
                await self.go.wait()
            except asyncio.CancelledError:
                self.cancelled.append(note.entry_id)
                raise


@contextlib.asynccontextmanager
async def running(
    url: str, service: str, handler: Hold, consumer: str = "w1"
) -> AsyncIterator[lbs.Client]:
    """A client of ``service`` running ``handler`` (``run()``) for the block; closed after it."""
    c = client(url, service, consumer)
    task = asyncio.create_task(c.run(handler))
    try:
        yield c
    finally:
        await c.close()
        with contextlib.suppress(BaseException):
            await task
