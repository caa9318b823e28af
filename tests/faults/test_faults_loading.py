"""Fault 9: Redis restarts and loads its data for seconds (answering LOADING) while dones and
hand-backs are in flight. LOADING means "not ready yet", like a refused connection: the finisher
and the hand-back wait and send again, so finished work is never thrown away and run again, and
nothing counts a retry the handler did not cause."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import redis.asyncio as aioredis
from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError

import lbs

from _fleet import SETTLE, TEST_TIMEOUT, Figures, Report, eventually, server

# On Valkey too in make test (tests/faults/conftest.py): a fault whose handling depends on the server.
pytestmark = [pytest.mark.timeout(TEST_TIMEOUT), pytest.mark.valkey_smoke]

STREAMS, FAILING = 10, 3
#: Keys the server loads at start, and how long it sleeps per key (µs): about 4 s of LOADING.
FILLER, LOAD_DELAY_US = 8_000, 500


async def test_dones_and_hand_backs_during_loading_wait_for_the_data_set(
    service: str, report: Report
) -> None:
    # Redis answers while loading only every loading-process-events-interval-bytes of the file
    # (2 MB by default: more than this whole data set), so that is made small.
    with server(
        **{"key-load-delay": str(LOAD_DELAY_US), "loading-process-events-interval-bytes": "1024"}
    ) as srv:
        r = aioredis.Redis.from_url(srv.url)
        pipe = r.pipeline(transaction=False)
        for i in range(FILLER):
            pipe.set(f"filler:{i}", "x")
        await pipe.execute()
        release = asyncio.Event()
        runs: list[tuple[str, int, int]] = []

        async def handle(note: lbs.Notification) -> None:
            runs.append((note.stream, note.token, note.retry_count))
            await release.wait()
            if note.stream.startswith("fail-") and note.retry_count == 0:
                raise RuntimeError("fails once, during the loading")

        names = [f"ok-{i}" for i in range(STREAMS - FAILING)] + [
            f"fail-{i}" for i in range(FAILING)
        ]
        async with lbs.Producer(r, service) as producer:
            await producer.add_streams(names)
        c = lbs.Client(
            srv.url,
            service,
            consumer_id="c",
            config=lbs.Config(
                lock_ttl=30.0, read_block=0.05, retry_delay=0.05, retry_delay_max=0.05
            ),
            load_entrypoint_plugins=False,
        )
        runner = asyncio.create_task(c.run(handle, concurrency=STREAMS))
        try:

            async def all_running() -> bool:
                return len(runs) == STREAMS

            assert await eventually(all_running, timeout=SETTLE, what="every handler running")
            srv.restart(
                save=True, wait=False
            )  # the locks and entries are saved; loading takes seconds
            loading_seen = False
            probe = aioredis.Redis.from_url(srv.url)

            async def loading() -> bool:
                nonlocal loading_seen
                try:
                    await probe.ping()
                except BusyLoadingError:
                    loading_seen = True
                    return True
                except (RedisConnectionError, OSError):
                    return False
                return False

            await eventually(loading, timeout=SETTLE, every=0.01, what="the server loading")
            release.set()  # dones and hand-backs now meet LOADING
            t0 = time.monotonic()

            async def finished() -> bool:
                return c.stats.done == STREAMS

            settled = await eventually(finished, timeout=SETTLE, what="every stream finished")
            took = time.monotonic() - t0
            await probe.aclose()
        finally:
            await c.close()
            await runner
        counts = Counter(stream for stream, _, _ in runs)
        reruns = {s: n for s, n in counts.items() if n != (2 if s.startswith("fail-") else 1)}
        retries = sum(1 for s, _, rc in runs if rc and not s.startswith("fail-"))
        tokens = {}
        token_went_back = 0
        for stream, token, _ in runs:
            token_went_back += stream in tokens and token <= tokens[stream]
            tokens[stream] = token
        await r.aclose()  # its connection died with the restart
        after = aioredis.Redis.from_url(srv.url)
        left = await after.xlen(lbs.input_stream(service))
        await after.aclose()
    fig = Figures(
        "loading-restart",
        STREAMS,
        len(runs),
        c.stats.done,
        1,
        STREAMS - c.stats.done,
        sum(max(0, n - (2 if s.startswith("fail-") else 1)) for s, n in counts.items()),
        retries,
        0,
        0,
        extra={
            "loading_seen": loading_seen,
            "settle_s": round(took, 2),
            "lbs_left": left,
            "token_went_back": token_went_back,
        },
    )
    report(fig)
    assert loading_seen, "the server was never seen loading: the fault did not happen"
    assert settled, fig.unsettled()
    assert reruns == {} and retries == 0 and token_went_back == 0, fig.line()
    assert left == 0
