"""The Spark sink's XADD encoder (encode_xadds) against redis-py's packing, byte for byte."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _lbscore import CommandBatch, XaddRoute, encode_xadds
from lbs.exceptions import DataError

from _corehelpers import pack_commands


def expected(
    streams: list[Any],
    names: list[str],
    columns: list[list[Any]],
    sizes: dict[str, int],
    prefix: bytes,
) -> bytes:
    """What the sink means, written plainly: one XADD per row, IDMP ids counted per stream."""
    counts: dict[str, int] = {}
    commands = []
    for i, stream in enumerate(streams):
        if stream is None:
            continue
        n = counts.get(stream, 0)
        counts[stream] = n + 1
        cmd: list[Any] = ["XADD", stream]
        if sizes.get(stream):
            cmd += ["IDMP", prefix + str(n // sizes[stream]).encode(), n % sizes[stream]]
        cmd.append("*")
        fields: list[Any] = []
        for name, col in zip(names, columns):
            if col[i] is not None:
                v = col[i]
                fields += [name, str(v) if isinstance(v, bool) else v]
        commands.append(cmd + (fields or [b"_empty", b""]))
    return pack_commands(commands)


values = st.one_of(
    st.none(),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.integers(),
    st.booleans(),
    st.floats(allow_nan=False),
)


@given(st.data())
def test_rows_encode_as_one_xadd_each_with_idmp_ids_per_stream(data: st.DataObject) -> None:
    nrows = data.draw(st.integers(0, 30))
    streams = data.draw(
        st.lists(st.sampled_from(["a", "b", "c", None]), min_size=nrows, max_size=nrows)
    )
    names = data.draw(st.lists(st.sampled_from(["x", "y", "z"]), max_size=3, unique=True))
    columns = [data.draw(st.lists(values, min_size=nrows, max_size=nrows)) for _ in names]
    sizes = {s: data.draw(st.integers(0, 4)) for s in "abc"}
    batch = CommandBatch()
    routes = {s: XaddRoute(batch, s, sizes[s], b"run:0:1:") for s in "abc"}
    written = encode_xadds(streams, names, columns, routes)
    assert written == sum(s is not None for s in streams) == len(batch)
    assert batch.getvalue() == expected(streams, names, columns, sizes, b"run:0:1:")


def test_a_slice_continues_the_counts_of_the_rows_before_it() -> None:
    batch = CommandBatch()
    routes = {"a": XaddRoute(batch, "a", 2, b"p:")}
    streams, cols = ["a"] * 5, [list(range(5))]
    assert encode_xadds(streams, ["n"], cols, routes, 0, 3) == 3
    assert encode_xadds(streams, ["n"], cols, routes, 3) == 2
    assert batch.getvalue() == expected(streams, ["n"], cols, {"a": 2}, b"p:")
    assert routes["a"].count == 5


def test_columns_must_match_the_rows() -> None:
    routes = {"a": XaddRoute(CommandBatch(), "a")}
    with pytest.raises(DataError, match="has 1 values for 2 rows"):
        encode_xadds(["a", "a"], ["n"], [[1]], routes)
    with pytest.raises(KeyError):
        encode_xadds(["nowhere"], [], [], routes)


def test_a_route_needs_a_batch_and_its_idmp_chunks_a_producer_id_prefix() -> None:
    with pytest.raises(TypeError):
        XaddRoute(None, "a")  # type: ignore[arg-type]
    batch = CommandBatch()
    route = XaddRoute(batch, "a", 2)
    route.pid_prefix = None  # type: ignore[assignment]
    with pytest.raises(DataError, match="no pid_prefix"):
        encode_xadds(["a"], ["n"], [[1]], {"a": route})
    assert len(batch) == 0 and batch.getvalue() == b""  # nothing half-written
