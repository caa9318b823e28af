"""Shared inputs for the benchmarks, so every side of a comparison gets the same data."""

from __future__ import annotations

from typing import Any


def stream_specs(n: int) -> list[tuple[str, dict[str, Any]]]:
    return [(f"session-{i}", {"user": f"u{i}", "shard": i % 7, "tags": ["a", "b"]}) for i in range(n)]


def xadd_commands(service: str, n: int) -> list[tuple[Any, ...]]:
    from lbs import encode_input, input_stream

    return [("XADD", input_stream(service), "*", "lbs-input", encode_input(name, info))
            for name, info in stream_specs(n)]
