"""The compiled core against what redis-py does in Python for the same bytes."""

from __future__ import annotations

import json
from typing import Any

import hiredis
import pytest
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

from lbs import decode_input, encode_input
from _lbscore import pack_commands

from .data import stream_specs, xadd_commands

_serializer = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)


def _redis_py_pack_commands(commands: list[tuple[Any, ...]]) -> bytes:
    # What redis-py's pipeline does: pack each command, join the chunks.
    return b"".join(b"".join(_serializer.pack(*c)) for c in commands)


def _hiredis_pack_commands(commands: list[tuple[Any, ...]]) -> bytes:
    return b"".join(hiredis.pack_command(c) for c in commands)


PACKERS = {"lbs": pack_commands, "redis-py": _redis_py_pack_commands, "hiredis": _hiredis_pack_commands}


@pytest.mark.benchmark(group="pack 100 XADD")
@pytest.mark.parametrize("impl", list(PACKERS))
def bench_pack_xadd_batch(benchmark: Any, impl: str) -> None:
    commands = xadd_commands("bench", 100)
    expected = _redis_py_pack_commands(commands)
    assert benchmark(PACKERS[impl], commands) == expected


def _json_encode(name: str, info: dict[str, Any]) -> bytes:
    return json.dumps({"DataStreamName": name, "Info": info}, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.benchmark(group="encode 100 lbs-input")
@pytest.mark.parametrize("impl", ["lbs", "json"])
def bench_encode_inputs(benchmark: Any, impl: str) -> None:
    specs = stream_specs(100)
    fn = encode_input if impl == "lbs" else _json_encode
    out = benchmark(lambda: [fn(n, i) for n, i in specs])
    assert out == [_json_encode(n, i) for n, i in specs]


def _json_decode(raw: bytes) -> tuple[str, dict[str, Any]]:
    doc = json.loads(raw)
    return doc["DataStreamName"], doc.get("Info") or {}


@pytest.mark.benchmark(group="decode 100 lbs-input")
@pytest.mark.parametrize("impl", ["lbs", "json"])
def bench_decode_inputs(benchmark: Any, impl: str) -> None:
    raws = [encode_input(n, i) for n, i in stream_specs(100)]
    fn = decode_input if impl == "lbs" else _json_decode
    assert benchmark(lambda: [fn(r) for r in raws]) == [_json_decode(r) for r in raws]
