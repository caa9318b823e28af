"""Registering 100 data streams: lbs.Producer against plain redis-py, same server, one run."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import lbs

from .data import stream_specs

if TYPE_CHECKING:
    from .conftest import Bench

N = 100


@pytest.mark.benchmark(group=f"register {N} data streams")
@pytest.mark.parametrize("impl", ["lbs add_streams", "redis-py pipeline", "redis-py one by one"])
def bench_register(bench: Bench, impl: str) -> None:
    r = bench.redis()
    # "bench-<impl>": the key names the figures were taken with.
    service = bench.service(impl.replace(" ", "-"), unique=False)
    stream = lbs.input_stream(service)
    producer = lbs.Producer(r, service)
    specs = stream_specs(N)

    async def with_lbs() -> int:
        return len(await producer.add_streams(specs))

    async def pipeline() -> int:
        pipe = r.pipeline(transaction=False)
        for name, info in specs:
            pipe.xadd(stream, {"lbs-input": lbs.encode_input(name, info)})
        return len(await pipe.execute())

    async def one_by_one() -> int:
        for name, info in specs:
            await r.xadd(stream, {"lbs-input": lbs.encode_input(name, info)})
        return N

    fn = {"lbs add_streams": with_lbs, "redis-py pipeline": pipeline, "redis-py one by one": one_by_one}[impl]
    assert bench(fn, rounds=None) == N
