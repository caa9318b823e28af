"""The compiled core against what redis-py does in Python for the same bytes."""

from __future__ import annotations

import json
from typing import Any

import hiredis
import pytest
from redis._parsers.encoders import Encoder
from redis.connection import PythonRespSerializer

from _lbscore import CommandBatch
from lbs import decode_input, encode_input

from .data import stream_specs, xadd_commands

_serializer = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)


def _redis_py_pack_commands(commands: list[tuple[Any, ...]]) -> bytes:
    # What redis-py's pipeline does: pack each command, join the chunks.
    return b"".join(b"".join(_serializer.pack(*c)) for c in commands)


def _lbs_pack_commands(commands: list[tuple[Any, ...]]) -> bytes:
    # What lbs's batches do: every command into one buffer.
    b = CommandBatch()
    for c in commands:
        b.command(*c)
    return b.getvalue()


def _hiredis_pack_commands(commands: list[tuple[Any, ...]]) -> bytes:
    return b"".join(hiredis.pack_command(c) for c in commands)


PACKERS = {
    "lbs": _lbs_pack_commands,
    "redis-py": _redis_py_pack_commands,
    "hiredis": _hiredis_pack_commands,
}


@pytest.mark.benchmark(group="pack 100 XADD")
@pytest.mark.parametrize("impl", list(PACKERS))
def bench_pack_xadd_batch(benchmark: Any, impl: str) -> None:
    commands = xadd_commands("bench", 100)
    expected = _redis_py_pack_commands(commands)
    benchmark.extra_info["baseline"] = impl == "hiredis"  # the fastest plain packer
    assert benchmark(PACKERS[impl], commands) == expected


def _json_encode(name: str, info: dict[str, Any]) -> bytes:
    return json.dumps(
        {"DataStreamName": name, "Info": info}, separators=(",", ":"), ensure_ascii=False
    ).encode()


@pytest.mark.benchmark(group="encode 100 lbs-input")
@pytest.mark.parametrize("impl", ["lbs", "json"])
def bench_encode_inputs(benchmark: Any, impl: str) -> None:
    specs = stream_specs(100)
    fn = encode_input if impl == "lbs" else _json_encode
    benchmark.extra_info["baseline"] = impl == "json"
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
    benchmark.extra_info["baseline"] = impl == "json"
    assert benchmark(lambda: [fn(r) for r in raws]) == [_json_decode(r) for r in raws]


# What a Python producer's own json.dumps writes: the compact form (ours and
# Go's), the default separators (", " and ": ") and an indented document. The
# core's fast path reads all three; json.loads is the reference.
JSON_DUMPS_LAYOUTS: dict[str, dict[str, Any]] = {
    "compact": {"separators": (",", ":")},
    "default separators": {},
    "indent=2": {"indent": 2},
}


@pytest.mark.benchmark(group="decode 100 lbs-input written by json.dumps")
@pytest.mark.parametrize("layout", list(JSON_DUMPS_LAYOUTS))
def bench_decode_json_dumps_inputs(benchmark: Any, layout: str) -> None:
    raws = [
        json.dumps({"DataStreamName": n, "Info": i}, **JSON_DUMPS_LAYOUTS[layout]).encode()
        for n, i in stream_specs(100)
    ]
    assert benchmark(lambda: [decode_input(r) for r in raws]) == [_json_decode(r) for r in raws]


def _xreadgroup_reply(service: str, n: int) -> bytes:
    """The RESP3 bytes of an XREADGROUP reply with ``n`` entries (one stream),
    the managed fields set as after a re-queue."""
    from lbs import input_stream

    stream = input_stream(service).encode()
    out = [b"%1\r\n", b"$%d\r\n%s\r\n" % (len(stream), stream), b"*%d\r\n" % n]
    for i, (name, info) in enumerate(stream_specs(n)):
        entry_id = b"1795360974434-%d" % i
        fields = [
            b"lbs-input",
            encode_input(name, info),
            b"_retry_count",
            b"1",
            b"_original_id",
            entry_id,
        ]
        out.append(b"*2\r\n$%d\r\n%s\r\n*%d\r\n" % (len(entry_id), entry_id, len(fields)))
        out.extend(b"$%d\r\n%s\r\n" % (len(f), f) for f in fields)
    return b"".join(out)


def _parse_lbs(raw: bytes, parser: Any) -> list[Any]:
    # The core's reader: the bytes straight into Entry objects (id, stream,
    # info decoded, retry count, original id; fields kept for .fields).
    from _lbscore import RespReader, Shape

    reader = RespReader()
    reader.feed(raw)
    return reader.gets_entries(parser, Shape.XREAD)  # type: ignore[no-any-return]


def _parse_redis_py(raw: bytes, parser: Any) -> list[tuple[bytes, dict[bytes, bytes], Any, int]]:
    # redis-py's path for the same bytes: its hiredis reader, its XREADGROUP
    # response callback, then json.loads and the managed fields in Python.
    from redis._parsers.helpers import parse_xread_resp3

    reader = hiredis.Reader()
    reader.feed(raw)
    out = []
    for entries in parse_xread_resp3(reader.gets()).values():
        for entry_id, fields in entries[0]:
            out.append(
                (
                    entry_id,
                    fields,
                    json.loads(fields[b"lbs-input"]),
                    int(fields.get(b"_retry_count", 0)),
                )
            )
    return out


def _summary(result: list[Any]) -> list[tuple[str, str, dict[str, Any], int]]:
    if result and isinstance(result[0], tuple):
        return [
            (i.decode(), doc["DataStreamName"], doc.get("Info") or {}, rc)
            for i, _f, doc, rc in result
        ]
    return [(e.id, e.stream, e.info, e.retry_count) for e in result]


@pytest.mark.benchmark(group="parse a 256-entry XREADGROUP reply")
@pytest.mark.parametrize("impl", ["lbs", "redis-py + json.loads"])
def bench_parse_xreadgroup(benchmark: Any, impl: str) -> None:
    from _lbscore import EntryParser

    raw = _xreadgroup_reply("bench", 256)
    parser = EntryParser()
    fn = _parse_lbs if impl == "lbs" else _parse_redis_py
    benchmark.extra_info["baseline"] = impl != "lbs"
    result = benchmark(fn, raw, parser)
    assert _summary(result) == _summary(_parse_redis_py(raw, parser)) and len(result) == 256


# The consumer's hot paths in the core: one EVALSHA over many entries, written
# straight into the buffer (CommandBatch.evalsha_locks), and holding, finding
# and dropping streams.

_LOCK_PREFIX = "lock:{bench-input}:"
_HELD = 100
_KEYS = ("lbs", "{lbs}:consumers", "instance")
_ARGS = (600_000, "group", "consumer", 1, "nonce")


def _held_entries(n: int) -> list[Any]:
    # Entries as the reader parses them from the LBS.
    from _lbscore import EntryParser

    replies = [
        [b"1795360974434-%d" % i, [b"lbs-input", encode_input(name, info)]]
        for i, (name, info) in enumerate(stream_specs(n))
    ]
    return EntryParser().parse_entries(replies)


def _held_table(n: int) -> Any:
    from _lbscore import HeldTable

    table = HeldTable("redis-consumer-bench", _LOCK_PREFIX)
    for token, e in enumerate(_held_entries(n), 1):
        table.take(e, token, e.retry_count, 0.0)
    return table


def _evalsha_redis_py(table: Any, held: list[Any]) -> bytes:
    return _redis_py_pack_commands(
        [
            (
                "EVALSHA",
                "f" * 40,
                len(_KEYS) + len(held),
                *_KEYS,
                *(h.lock_key for h in held),
                *_ARGS,
                *(h.value for h in held),
                *(h.entry_id for h in held),
            )
        ]
    )


def _evalsha_locks(table: Any, held: list[Any]) -> bytes:
    from _lbscore import CommandBatch

    batch = CommandBatch()
    batch.evalsha_locks(
        "f" * 40,
        _KEYS,
        _LOCK_PREFIX.encode(),
        [h.entry_id for h in held],
        _ARGS,
        [h.value for h in held],
    )
    return batch.getvalue()


EVALSHA_WRITERS = {
    "lbs evalsha_locks": _evalsha_locks,
    "redis-py": _evalsha_redis_py,
}


@pytest.mark.benchmark(group=f"EVALSHA over {_HELD} locks")
@pytest.mark.parametrize("impl", list(EVALSHA_WRITERS))
def bench_evalsha_over_locks(benchmark: Any, impl: str) -> None:
    table = _held_table(_HELD)
    held = table.values()
    benchmark.extra_info["baseline"] = impl == "redis-py"
    expected = _evalsha_redis_py(table, held)
    assert benchmark(EVALSHA_WRITERS[impl], table, held) == expected


@pytest.mark.benchmark(group=f"hold {_HELD} streams")
@pytest.mark.parametrize("op", ["take + drop", "find"])
def bench_held_table(benchmark: Any, op: str) -> None:
    from _lbscore import HeldTable

    entries = _held_entries(_HELD)
    table = _held_table(_HELD)
    streams = [e.stream for e in entries]

    def take_drop() -> int:
        t = HeldTable("redis-consumer-bench", _LOCK_PREFIX)
        held = [t.take(e, token, e.retry_count, 0.0) for token, e in enumerate(entries, 1)]
        return sum(t.drop(h) for h in held)

    def find() -> int:
        return sum(table.find(s) is not None for s in streams)

    assert benchmark(take_drop if op == "take + drop" else find) == _HELD
