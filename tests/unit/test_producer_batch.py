"""How Producer.add_streams lays out a batch (one MULTI/EXEC per shard) and reads its replies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ResponseError

import lbs
from _lbscore import CommandBatch, RespReader
from lbs.producer import _transaction_outcome


class _FakeWire:
    """Records each batch as a list of commands and answers like Redis would, in a transaction."""

    def __init__(self, fail_shard: str | None = None) -> None:
        self.batches: list[list[list[bytes]]] = []
        self.fail_shard = fail_shard
        self.seq = 0

    async def execute(self, build: Callable[[CommandBatch], None]) -> list[Any]:
        batch = CommandBatch()
        build(batch)
        reader = RespReader()
        reader.feed(batch.getvalue())
        commands = [reader.gets() for _ in range(len(batch))]
        self.batches.append(commands)
        replies: list[Any] = []
        results: list[Any] = []
        for cmd in commands:
            if cmd[0] == b"MULTI":
                replies.append(b"OK")
                results = []
            elif cmd[0] == b"XADD":
                replies.append(b"QUEUED")
                if cmd[1].decode() == self.fail_shard:
                    results.append(
                        ResponseError(
                            "WRONGTYPE Operation against a key holding the wrong kind of value"
                        )
                    )
                else:
                    self.seq += 1
                    results.append(f"1-{self.seq}".encode())
            else:
                assert cmd == [b"EXEC"]
                replies.append(results)
        return replies

    async def close(self) -> None:
        pass


def _producer(shards: int, wire: _FakeWire) -> lbs.Producer:
    producer = lbs.Producer("redis://127.0.0.1:1", "svc", shards=shards)  # no I/O
    producer._routes._plain = wire  # type: ignore[assignment]
    return producer


async def test_each_shard_is_one_transaction_in_one_batch() -> None:
    wire = _FakeWire()
    producer = _producer(3, wire)
    names = [f"n{i}" for i in range(12)]
    ids = await producer.add_streams(names)
    assert len(ids) == 12 and len(set(ids)) == 12
    (batch,) = wire.batches  # one round trip
    shards: list[tuple[bytes, list[bytes]]] = []
    for cmd in batch:
        if cmd == [b"MULTI"]:
            shards.append((b"", []))
        elif cmd[0] == b"XADD":
            key, _, field, payload = cmd[1:]
            assert field == b"lbs-input" and (shards[-1][0] in (b"", key))
            shards[-1] = (key, shards[-1][1] + [payload])
        else:
            assert cmd == [b"EXEC"]
    assert sorted(k for k, _ in shards) == sorted(
        lbs.input_stream(svc).encode() for svc in lbs.shard_services("svc", 3)
    )  # one each
    for key, payloads in shards:
        in_shard = [n for n in names if producer.streams[lbs.shard_of(n, 3)].encode() == key]
        assert [lbs.decode_input(p)[0] for p in payloads] == in_shard  # input order kept


async def test_a_failed_shard_is_reported_by_position() -> None:
    producer = _producer(2, _FakeWire(fail_shard=lbs.input_stream(lbs.shard_services("svc", 2)[1])))
    names = [f"n{i}" for i in range(8)]
    with pytest.raises(lbs.BatchError, match="WRONGTYPE") as info:
        await producer.add_streams(names)
    bad = [lbs.shard_of(n, 2) == 1 for n in names]
    assert any(bad) and not all(bad)
    assert [i is None for i in info.value.entry_ids] == bad and info.value.unknown == []


async def test_a_lost_connection_makes_every_position_unknown() -> None:
    class Dropping(_FakeWire):
        async def execute(self, build: Callable[[CommandBatch], None]) -> list[Any]:
            raise lbs.RedisOperationError("x", ConnectionError("gone"))  # any failure of the send

    producer = _producer(2, Dropping())
    with pytest.raises(lbs.BatchError, match="0 of 3 registered, 3 unknown") as info:
        await producer.add_streams(["a", "b", "c"])
    assert info.value.entry_ids == [None] * 3 and info.value.unknown == [0, 1, 2]


def test_outcome_of_a_transaction_that_ran() -> None:
    assert _transaction_outcome([b"OK", b"QUEUED", b"QUEUED", [b"1-0", b"1-1"]], 2) == (
        ["1-0", "1-1"],
        None,
    )


def test_outcome_of_a_command_that_failed_as_it_ran() -> None:
    err = ResponseError("WRONGTYPE x")
    assert _transaction_outcome([b"OK", b"QUEUED", b"QUEUED", [b"1-0", err]], 2) == (
        ["1-0", None],
        err,
    )


def test_outcome_of_an_aborted_transaction_names_the_refused_command() -> None:
    oom = ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
    abort = ResponseError("EXECABORT Transaction discarded because of previous errors.")
    assert _transaction_outcome([b"OK", oom, oom, abort], 2) == ([None, None], oom)
    moved = ResponseError("MOVED 1234 127.0.0.1:7001")
    ids, error = _transaction_outcome([b"OK", moved, abort], 1)
    assert ids == [None] and error is moved


def test_outcome_without_a_transaction_when_multi_is_refused() -> None:
    # An ACL without MULTI: each XADD ran on its own; EXEC's error is not the batch's.
    noperm = ResponseError("NOPERM this user has no permissions to run the 'multi' command")
    no_multi = ResponseError("ERR EXEC without MULTI")
    assert _transaction_outcome([noperm, b"1-0", b"1-1", no_multi], 2) == (["1-0", "1-1"], None)
