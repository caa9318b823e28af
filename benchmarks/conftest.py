"""Benchmarks: lbs beside the plain redis-py way of doing the same work, in one run.

Run with ``make bench`` (``pytest benchmarks --benchmark-disable-gc``). ``make
test`` runs them once each with ``--benchmark-disable``, so they cannot rot.
The server fixtures come from the root conftest.py; ``bench`` (below) does
what every benchmark here would otherwise repeat, so each says only what it
measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from importlib.metadata import version
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis

from lbs.embedded import find_redis_server, redis_server_version

from .cost import Cost, Window
from .data import cleanup, service_name

_N = TypeVar("_N", int, float)


def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    # Numbers mean little without what produced them.
    server = find_redis_server()
    machine_info["lbs"] = {
        "lbs": version("lbs-streams"),
        "redis-py": version("redis"),
        "hiredis": version("hiredis"),
        "Cython": version("Cython"),
        "redis-server": ".".join(map(str, redis_server_version(server) or ())),
    }


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A private event loop: pytest-benchmark calls plain functions, so async work
    runs through ``loop.run_until_complete`` on both sides of a comparison."""
    lp = asyncio.new_event_loop()
    try:
        yield lp
    finally:
        lp.close()


class Bench:
    """The common part of a benchmark here; the ``bench`` fixture gives one per benchmark.

    * ``bench(fn, setup=None, rounds=3, warmup_rounds=0)`` times ``fn`` with
      ``benchmark.pedantic``, one iteration a round, and returns its result.
      ``rounds=None`` leaves the number of rounds to pytest-benchmark's
      calibration (plain ``benchmark(fn)``, for work of a millisecond or so).
      An ``async def`` ``fn`` runs through ``loop.run_until_complete``, inside
      the timing, the same way for every side of a comparison. ``setup`` runs
      before each round, outside the timing; it may return an awaitable, and
      gives ``fn``'s arguments: ``None`` (none), a tuple, or one value.
      ``bench.inputs`` keeps each round's arguments, in order.
    * ``bench.drain(cycle, n, setup, per, baseline=False)``: a drain benchmark (the assignment
      cycle, keyed throughput): client and Redis CPU and INFO commandstats per ``per`` in
      ``extra_info`` (``baseline`` marks the group's baseline row for ``benchmarks.report``).
    * ``bench.run(awaitable)``: async set-up and checks, on the same loop.
    * ``bench.url``: the session's Redis >= 8.4 (``redis_server``, started only
      when asked for); ``bench.redis()`` a new ``redis.asyncio`` client on it;
      ``bench.service(tag)`` a service name no other round or run shares.
    * At teardown, after the benchmark and outside its timing, in the reverse
      order of registration: the services' keys are deleted, the clients
      closed, and what ``bench.defer`` was given is called (sync or async).
    * ``bench.benchmark`` is pytest-benchmark's fixture (``group``, ``stats``,
      ``disabled``); ``bench.extra_info`` its figures beside the timing.
    * ``bench.size(full, smoke)``: ``full`` when timed, ``smoke`` with
      ``--benchmark-disable`` (``make test``, one run so the benchmark cannot
      rot): the same code path and checks on less work.
    """

    def __init__(
        self,
        benchmark: Any,
        loop: asyncio.AbstractEventLoop,
        request: pytest.FixtureRequest,
        teardown: contextlib.ExitStack,
    ) -> None:
        self.benchmark = benchmark
        self.loop = loop
        self.inputs: list[tuple[Any, ...]] = []
        self._request = request
        self._teardown = teardown
        self._admin: aioredis.Redis | None = None  # deletes the services' keys at teardown

    @property
    def extra_info(self) -> dict[str, Any]:
        return self.benchmark.extra_info  # type: ignore[no-any-return]

    @functools.cached_property
    def url(self) -> str:
        return str(self._request.getfixturevalue("redis_server").url)

    def size(self, full: _N, smoke: _N) -> _N:
        """``full`` when the benchmark is timed; ``smoke`` under ``--benchmark-disable``."""
        return smoke if self.benchmark.disabled else full

    def run(self, aw: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(aw)

    def defer(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` at teardown, awaiting what it returns if that is awaitable."""

        def call() -> None:
            result = fn(*args)
            if inspect.isawaitable(result):
                self.run(result)

        self._teardown.callback(call)

    def redis(self) -> aioredis.Redis:
        """A new ``redis.asyncio`` client on ``bench.url``, closed at teardown."""
        r = aioredis.Redis.from_url(self.url)
        self.defer(r.aclose)
        return r

    def service(self, tag: str, *, unique: bool = True) -> str:
        """A service name, its keys deleted at teardown: ``bench-<tag>-<n>-<random>``;
        ``unique=False`` gives ``bench-<tag>`` itself, where a benchmark's figures
        were taken under that name."""
        if self._admin is None:
            self._admin = self.redis()
        name = service_name(tag) if unique else f"bench-{tag}"
        self.defer(cleanup, self._admin, name)
        return name

    def __call__(
        self,
        fn: Callable[..., Any],
        *,
        setup: Callable[[], Any] | None = None,
        rounds: int | None = 3,
        warmup_rounds: int = 0,
    ) -> Any:
        target = self._timed(fn)
        if rounds is None:
            if setup is not None or warmup_rounds:
                raise ValueError("calibrated rounds take no setup and no warm-up rounds")
            return self.benchmark(target)
        return self.benchmark.pedantic(
            target,
            setup=None if setup is None else self._arguments(setup),
            rounds=rounds,
            iterations=1,
            warmup_rounds=warmup_rounds,
        )

    def drain(
        self,
        cycle: Callable[[aioredis.Redis, str, int], Awaitable[int]],
        n: int,
        setup: Callable[[], Any],
        per: str,
        *,
        baseline: bool = False,
    ) -> None:
        """Time ``await cycle(r, service, n)`` (``service`` from ``setup``), which must finish ``n``.

        ``extra_info``, in µs per ``per``: the least client CPU (this process) and the least Redis
        CPU (``INFO cpu``, so every client of the server counts) of the rounds, and the INFO
        commandstats of the round with the least Redis CPU (``commands_per_<per>``: ``{cmd: [calls,
        usec]}``); ``count`` and ``per`` (``benchmarks.report`` prints ``<per>s/s``); ``baseline``.
        """
        r = self.redis()
        client_cpu: list[float] = []
        costs: list[Cost] = []

        async def measured(service: str) -> int:
            window = await Window.open(r)
            client0 = time.process_time()
            done = await cycle(r, service, n)
            client_cpu.append(time.process_time() - client0)
            costs.append(await window.close())
            return done

        assert self(measured, setup=setup) == n
        least = min(costs, key=lambda c: c.cpu)
        self.extra_info["baseline"] = baseline
        self.extra_info["count"] = n
        self.extra_info["per"] = per
        self.extra_info[f"client_cpu_us_per_{per}"] = round(min(client_cpu) / n * 1e6, 2)
        self.extra_info[f"redis_cpu_us_per_{per}"] = round(least.cpu / n * 1e6, 2)
        self.extra_info[f"commands_per_{per}"] = least.per(n)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.iscoroutinefunction(fn):
            return fn
        run = self.loop.run_until_complete
        return lambda *args: run(fn(*args))

    def _arguments(
        self, setup: Callable[[], Any]
    ) -> Callable[[], tuple[tuple[Any, ...], dict[str, Any]] | None]:
        def made() -> tuple[tuple[Any, ...], dict[str, Any]] | None:
            value = setup()
            if inspect.isawaitable(value):
                value = self.run(value)
            args = () if value is None else value if isinstance(value, tuple) else (value,)
            self.inputs.append(args)
            return (args, {}) if args else None

        return made


@pytest.fixture
def bench(
    benchmark: Any, loop: asyncio.AbstractEventLoop, request: pytest.FixtureRequest
) -> Iterator[Bench]:
    """The benchmark's timing, event loop, Redis clients and service names (see ``Bench``)."""
    with contextlib.ExitStack() as teardown:
        yield Bench(benchmark, loop, request, teardown)
