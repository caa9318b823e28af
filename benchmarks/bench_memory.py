"""Client memory per held stream: the held table with 100,000 held streams.

The table is filled the way the reader fills it: entries as a read's XREADGROUP
returns them (``[id, [field, value, ...]]``) are parsed by the client's
``EntryParser`` and each becomes a record with ``HeldTable.take``; the
parsed entries are then dropped, as they are after a read. What stays is
what holding costs: the record, its entry id, stream name and Info, and the
table's two indexes. tracemalloc counts it; ``extra_info`` has bytes per
held stream (the Go reference client documents about 2.5 KB). The timing is
of the fill itself, without tracemalloc.

What a whole process holding a million streams costs (its resident memory per held stream, its
tick's Redis cost beside one held stream's) is ``python -m benchmarks.hold_scale``: a script, as
it takes minutes; ``bench_hold_scale_script_runs`` runs it once, small.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import TYPE_CHECKING, Any

import pytest

import lbs
from _lbscore import EntryParser, HeldTable, encode_input
from lbs._keys import lock_key

if TYPE_CHECKING:
    from .conftest import Bench

HELD = 100_000
#: ``HELD`` with ``--benchmark-disable`` (``make test``): the figure is about the same from 10,000 on.
SMOKE_HELD = 10_000


def _replies(n: int) -> list[list[Any]]:
    # Entry ids as XADD makes them (several per millisecond), stream names and
    # an empty Info as the benchmarks' producers register them.
    return [
        [f"{1_700_000_000_000 + i // 4}-{i % 4}".encode(), [b"lbs-input", encode_input(f"s{i}")]]
        for i in range(n)
    ]


def _fill(table: HeldTable, parser: EntryParser, replies: list[list[Any]]) -> None:
    for token, e in enumerate(parser.parse_entries(replies), 1):
        table.take(e, token, e.retry_count, 0.0)


def _new() -> tuple[HeldTable, EntryParser]:
    config = lbs.Config()
    parser = EntryParser(
        lbs.INPUT_FIELD,
        config.field_prefix + "retry_count",
        config.field_prefix + "original_id",
        config.max_input_bytes,
    )
    # As the client builds it (lbs._consumer.state.Holdings): the hold's owner "<consumer id>:<instance
    # nonce>" and the key prefix every record shares.
    return HeldTable("redis-consumer-bench:0123456789ab", lock_key("bench-memory", "")), parser


def bytes_per_held_stream(n: int) -> float:
    """Bytes the table holds per stream after taking ``n`` streams."""
    replies = _replies(n)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table, parser = _new()
        _fill(table, parser, replies)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(table) == n
    return held / n


@pytest.mark.benchmark(group=f"held table, {HELD} streams")
def bench_held_table_memory(bench: Bench) -> None:
    held = bench.size(HELD, SMOKE_HELD)
    replies = _replies(held)
    bench(_fill, setup=lambda: (*_new(), replies))
    per_stream = bytes_per_held_stream(held)
    bench.extra_info["bytes_per_held_stream"] = round(per_stream)
    # Loose: the figure is ~280 bytes on CPython 3.11; the old layout (a
    # dataclass with value and lock key strings, a list per stream) was ~650.
    assert per_stream < 512


def bench_hold_scale_script_runs() -> None:
    """``python -m benchmarks.hold_scale`` (one process holding a million streams: its memory per held
    stream and its tick's Redis cost beside one held stream's), once and small, so it cannot rot."""
    import asyncio

    from .hold_scale import main

    out = asyncio.run(main(streams=500))
    assert out["streams"] == 500 and out["rss_bytes_per_held_stream"] > 0
    for row in ("tick_holding_all", "tick_holding_one"):
        assert out[row]["redis_cpu_us_per_tick"] > 0, out
