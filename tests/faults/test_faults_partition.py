"""Fault 10: a network partition between one consumer and Redis (a TCP proxy that forwards nothing
and resets nothing, as a blackhole does) while it runs handlers. Its local lease runs out before its
locks can expire, so it stops its handlers (STREAM_DISOWNED, handlers cancelled) before another
consumer can take the streams; the other consumer then takes them. The takeover counts a death (to
the other consumer a cut-off holder looks dead); once the network heals the cut-off holder pardons
the streams it lost, and the retry is taken back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs import _keys

from _fleet import SETTLE, TEST_TIMEOUT, Figures, Report, eventually, server

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)

STREAMS, TTL = 5, 1.0


class Proxy:
    """A loopback TCP proxy to ``port``; ``blackhole`` True forwards nothing either way: connections stay
    open and what is sent waits, as on a cut network while TCP retransmits (minutes, before it gives up);
    False again delivers it, as when the network heals."""

    def __init__(self, port: int) -> None:
        self.target = port
        self._healed = asyncio.Event()
        self._healed.set()
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._healed.wait()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    @property
    def blackhole(self) -> bool:
        return not self._healed.is_set()

    @blackhole.setter
    def blackhole(self, on: bool) -> None:
        if on:
            self._healed.clear()
        else:
            self._healed.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def test_a_cut_off_holder_stops_its_handlers_before_another_consumer_starts_them(
    service: str, report: Report
) -> None:
    started: dict[tuple[str, str], float] = {}
    retried: list[
        int
    ] = []  # the other consumer's retry counts (the death it counted, pardoned later)
    stopped: dict[str, float] = {}  # the cut-off consumer's handlers, when each was told to stop

    def handler(name: str) -> Any:
        async def handle(note: lbs.Notification) -> None:
            started[(name, note.stream)] = time.monotonic()
            if name == "other":
                retried.append(note.retry_count)
            try:
                await asyncio.Event().wait()  # works until told it lost the stream
            except asyncio.CancelledError:
                if name == "cut-off":
                    stopped.setdefault(note.stream, time.monotonic())
                raise

        return handle

    # drain_timeout 0: the handlers work until cancelled, so a drain at close would only wait out its
    # time (20 s for each consumer) before the same cancel and hand-back.
    cfg = dict(
        lock_ttl=TTL,
        read_block=0.05,
        deadline_poll_interval=0.05,
        retry_delay=0.0,
        drain_timeout=0.0,
    )
    with server() as srv:
        proxy = await Proxy(srv.port).start()
        cut_off = lbs.Client(
            f"redis://127.0.0.1:{proxy.port}",
            service,
            consumer_id="cut-off",
            config=lbs.Config(**cfg),
            load_entrypoint_plugins=False,
        )
        other = lbs.Client(
            srv.url,
            service,
            consumer_id="other",
            config=lbs.Config(**cfg),
            load_entrypoint_plugins=False,
        )
        runners: list[asyncio.Task[None]] = []
        try:
            async with lbs.Producer(srv.url, service) as producer:
                await producer.add_streams([f"s-{i}" for i in range(STREAMS)])
            runners.append(asyncio.create_task(cut_off.run(handler("cut-off"))))

            async def all_held() -> bool:
                return sum(1 for who, _ in started if who == "cut-off") == STREAMS

            assert await eventually(
                all_held, timeout=SETTLE, what="the first consumer running every stream"
            )
            runners.append(asyncio.create_task(other.run(handler("other"))))
            proxy.blackhole = True  # the partition: nothing arrives, nothing is reset
            cut_at = time.monotonic()

            async def taken_over() -> bool:
                return sum(1 for who, _ in started if who == "other") == STREAMS

            settled = await eventually(
                taken_over, timeout=SETTLE, what="the other consumer running every stream"
            )
            proxy.blackhole = (
                False  # heal: the cut-off consumer's next tick pardons what was taken over
            )
            r = aioredis.Redis.from_url(srv.url)
            pardons = _keys.pardons_key(service)

            async def pardoned() -> bool:
                return await r.zcard(pardons) == STREAMS

            all_pardoned = await eventually(
                pardoned, timeout=SETTLE, what="the cut-off consumer's pardons"
            )
            await (
                other.close()
            )  # hands every stream back, no retry counted: the copies show the pardon
            copies = [fields for _, fields in await r.xrange(lbs.input_stream(service))]
            await r.aclose()
        finally:
            proxy.blackhole = False  # heal, so the cut-off consumer can close
            await cut_off.close()
            await other.close()
            for task in runners:
                await task
            await proxy.close()
    names = [f"s-{i}" for i in range(STREAMS)]
    overlapping = [
        n
        for n in names
        if ("other", n) in started and not stopped.get(n, float("inf")) < started[("other", n)]
    ]
    fig = Figures(
        "partition-blackhole",
        STREAMS,
        len(started),
        sum(1 for who, _ in started if who == "other"),
        1,
        0,
        0,
        sum(1 for f in copies if int(f.get(b"_retry_count", 0))),
        0,
        len(overlapping),
        extra={
            "stopped_after_cut_s": round(max(stopped.values(), default=cut_at) - cut_at, 2),
            "taken_over_after_cut_s": round(
                max((t for (who, _), t in started.items() if who == "other"), default=cut_at)
                - cut_at,
                2,
            ),
            "lock_ttl_s": TTL,
            "retry_seen_by_taker": sum(1 for n in retried if n),
        },
    )
    report(fig)
    assert settled, "the other consumer never took the streams over"
    assert sorted(stopped) == names, fig.line()
    assert overlapping == [], f"handlers of two consumers ran at once: {overlapping}; {fig.line()}"
    # The takeover counted a death (the other side could not tell a cut-off holder from a dead one); the
    # cut-off holder, back, pardoned them, and the copies handed back carry no retry.
    assert all_pardoned, fig.line()
    assert len(copies) == STREAMS and all(
        int(f.get(b"_retry_count", 0)) == 0 and b"_deaths" not in f for f in copies
    ), copies
