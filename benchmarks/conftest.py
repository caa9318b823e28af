"""Benchmarks: lbs beside the plain redis-py way of doing the same work, in one run.

Run with ``make bench`` (``pytest benchmarks --benchmark-disable-gc``). ``make
test`` runs them once each with ``--benchmark-disable``, so they cannot rot.
The server fixtures come from the root conftest.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pytest

from lbs.embedded import find_redis_server, redis_server_version


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    # Numbers mean little without what produced them.
    server = find_redis_server()
    machine_info["lbs"] = {
        "lbs": version("lbs"),
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
