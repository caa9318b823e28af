"""Registering 100 data streams: lbs.Producer against plain redis-py, same server, one run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

import lbs

from .data import stream_specs

if TYPE_CHECKING:
    from .conftest import Bench

N = 100


@pytest.mark.benchmark(group=f"register {N} data streams")
@pytest.mark.parametrize(
    "impl",
    ["lbs add_streams", "redis-py pipeline", "redis-py one by one", "redis-py pipeline json.dumps"],
)
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

    async def pipeline_json_dumps() -> int:
        # A Python producer without lbs: json.dumps with its default separators
        # (", " and ": "), which consumers read on their fast path too.
        pipe = r.pipeline(transaction=False)
        for name, info in specs:
            pipe.xadd(stream, {"lbs-input": json.dumps({"DataStreamName": name, "Info": info})})
        return len(await pipe.execute())

    fn = {
        "lbs add_streams": with_lbs,
        "redis-py pipeline": pipeline,
        "redis-py one by one": one_by_one,
        "redis-py pipeline json.dumps": pipeline_json_dumps,
    }[impl]
    bench.extra_info["baseline"] = impl == "redis-py pipeline"  # the best plain producer
    assert bench(fn, rounds=None) == N
    if fn is pipeline_json_dumps:  # what lbs consumers make of it: the same streams
        entries = bench.run(r.xrange(stream, count=N))
        assert [lbs.decode_input(fields[b"lbs-input"]) for _id, fields in entries] == specs
