"""Fault 21: a consumer frozen (SIGSTOP) while its blocking read waits in Redis.

The reader sends its read behind a blocking wait in one write, so Redis reads and locks a new
registration for a consumer whose process is stopped. Its lock expires while it is frozen; another
consumer may take the stream over. When the frozen consumer is continued it reads that reply late:
it must start no handler for those entries (another consumer may run them), and its late reply must
cost the stream no retry.

Each test runs its consumers as processes (``lbs worker`` for ``run()`` and ``run_keyed()``,
``_deploy_handler.py`` for the notification API), each run audited in ``<service>-audit`` (see ``_deploy_handler.py``), with
``read_block`` 30 s (capped by lbs to half its lease) and a 2-s lock TTL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import lbs

from _fleet import HERE, TEST_TIMEOUT, eventually, read_audit, server

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)

LOCK_TTL = 2.0


class Proc:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)


@asynccontextmanager
async def consumers(url: str, service: str, mode: str) -> AsyncIterator:  # type: ignore[type-arg]
    """Start consumer processes on demand (``await start(label)``); all killed at the end."""
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
            LBS_URL=url,
            LBS_SERVICE=service,
            LBS_LOAD_PLUGINS="",
        )

        async def start(label: str) -> Proc:
            consumer = f"frozen-{label}"
            if mode in ("run", "keyed"):
                argv = [
                    sys.executable,
                    "-m",
                    "lbs",
                    "worker",
                    "_deploy_handler:handle_keyed" if mode == "keyed" else "_deploy_handler:handle",
                    "--consumer-id",
                    consumer,
                    "--lock-ttl",
                    str(LOCK_TTL),
                ]
            else:
                argv = [sys.executable, str(HERE / "_deploy_handler.py"), consumer, str(LOCK_TTL)]
            p = Proc(
                argv,
                {**env, "DEPLOY_WORKER": label, "LBS_READ_BLOCK": "30"},
                Path(tmp) / f"{label}.log",
            )
            procs.append(p)

            async def up() -> bool:
                assert p.proc.poll() is None, p.output()
                return "started on" in p.output()

            assert await eventually(up, 60), p.output()
            return p

        try:
            yield start
        finally:
            for p in procs:
                if p.proc.poll() is None:
                    p.signal(signal.SIGCONT)
                    p.proc.kill()
                p.proc.wait()


async def blocked_readers(r: aioredis.Redis) -> int:
    return sum(
        1
        for c in await r.client_list()
        if c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "")
    )


async def freeze_with_a_read_pending(
    r: aioredis.Redis,
    producer: lbs.Producer | lbs.Publisher,
    service: str,
    b: Proc,
    name: str,
    work: float,
) -> bool:
    """SIGSTOP ``b`` while its wait is blocked in Redis, then register ``name``: whether Redis delivered
    it to the frozen ``b`` (False when its wait had just timed out: then ``b`` is continued)."""
    assert await eventually(lambda: _at_least_one(r), 30), "the consumer never waited in Redis"
    b.signal(signal.SIGSTOP)
    if await blocked_readers(r) == 0:  # its wait ended just before the stop
        b.signal(signal.SIGCONT)
        return False
    if isinstance(producer, lbs.Publisher):  # a key's message registers the key
        await producer.publish(name, {"work": str(work)})
    else:
        await producer.add_stream(name, {"work": work})

    async def delivered() -> bool:
        rows = await r.xpending_range(
            lbs.input_stream(service), lbs.group_name(service), "-", "+", 10
        )
        return any(row["consumer"].decode() == "redis-consumer-frozen-b" for row in rows)

    if await eventually(delivered, 2.0):
        return True
    b.signal(signal.SIGCONT)
    return False


async def frozen_with_a_stream(
    r: aioredis.Redis,
    producer: lbs.Producer | lbs.Publisher,
    service: str,
    b: Proc,
    work: float,
) -> str:
    """:func:`freeze_with_a_read_pending` until it works (5 tries); the stream's name."""
    for attempt in range(5):
        name = f"x{attempt}"
        if await freeze_with_a_read_pending(r, producer, service, b, name, work):
            return name
    pytest.fail("could not stop the consumer while its read was pending (5 tries)")


async def ended(r: aioredis.Redis, service: str, name: str) -> bool:
    """Whether a run of ``name`` ended (the audit's ``end``)."""
    events = await read_audit(r, f"{service}-audit")
    return any(e["name"] == name and e["ev"] == "end" for e in events)


async def _at_least_one(r: aioredis.Redis) -> bool:
    return await blocked_readers(r) >= 1


async def starts_of(r: aioredis.Redis, service: str, name: str) -> list[dict[str, str]]:
    return [
        e
        for e in await read_audit(r, f"{service}-audit")
        if e["name"] == name and e["ev"] == "start"
    ]


@pytest.mark.parametrize("mode", ["run", "notifications", "keyed"])
async def test_a_frozen_consumer_starts_nothing_another_took_over(service: str, mode: str) -> None:
    with server() as srv:
        r = aioredis.Redis.from_url(srv.url)
        producer = (lbs.Publisher if mode == "keyed" else lbs.Producer)(srv.url, service)
        try:
            async with consumers(srv.url, service, mode) as start:
                b = await start("b")
                name = await frozen_with_a_stream(r, producer, service, b, 6.0)
                # B is frozen, the stream delivered and locked for it. A comes and takes it over
                # once B's lock (and deadline) expire.
                await start("a")

                async def a_runs() -> bool:
                    return any(e["worker"] == "a" for e in await starts_of(r, service, name))

                assert await eventually(a_runs, 30), "A never took the stream over"
                b.signal(signal.SIGCONT)

                async def b_answered() -> bool:  # refused its late reply, ran it, or lost it
                    started = any(e["worker"] == "b" for e in await starts_of(r, service, name))
                    return started or any(
                        m in b.output() for m in ("too late", "lost the lock", "lapsed")
                    )

                assert await eventually(b_answered, 30), b.output()[-3000:]

                assert await eventually(lambda: ended(r, service, name), 30)
                starts = await starts_of(r, service, name)
                output = b.output()
        finally:
            await producer.close()
            await r.aclose()
    assert [e["worker"] for e in starts] == ["a"], (
        f"the frozen consumer started the stream A had taken over: {starts}"
    )
    # Refused as read too late (the reply), or as read under a lapsed lease (the take).
    assert "too late" in output or "lapsed" in output, output[-3000:]


@pytest.mark.parametrize("mode", ["run", "notifications"])
async def test_a_late_reply_costs_no_retry(service: str, mode: str) -> None:
    """Alone: the frozen consumer's lock expires, nobody takes the stream; continued, it starts
    nothing from its late reply, puts the stream back with no retry counted and runs it afresh."""
    with server() as srv:
        r = aioredis.Redis.from_url(srv.url)
        producer = lbs.Producer(srv.url, service)
        try:
            async with consumers(srv.url, service, mode) as start:
                b = await start("b")
                name = await frozen_with_a_stream(r, producer, service, b, 0.05)
                await asyncio.sleep(2 * LOCK_TTL)  # its lock expires while it is frozen
                b.signal(signal.SIGCONT)

                assert await eventually(lambda: ended(r, service, name), 30), b.output()[-3000:]
                starts = await starts_of(r, service, name)
                output = b.output()
        finally:
            await producer.close()
            await r.aclose()
    assert len(starts) == 1, f"the late reply's stream started more than once: {starts}"
    assert starts[0]["retry"] == "0", f"the late reply cost a retry: {starts}"
    assert "lock_lost" not in output, f"it ran the stream on an expired lock: {output[-3000:]}"
    assert "too late" in output or "lapsed" in output, output[-3000:]
