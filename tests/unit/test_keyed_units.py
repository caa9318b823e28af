"""Pure logic of keyed processing: a keyed handler's detection, KeyedBatch.emit's idempotency ids,
the Publisher's refusals (before anything is sent)."""

from __future__ import annotations

from typing import Any

import pytest

import lbs
from lbs.cli.worker import takes_keyed_batch
from lbs.keyed import MAX_FIELDS


async def _keyed(batch: lbs.KeyedBatch) -> None: ...


async def _plain(note: lbs.Notification) -> None: ...


async def _bare(x) -> None: ...  # type: ignore[no-untyped-def]


def test_a_keyed_handler_is_told_by_its_first_parameter() -> None:
    assert takes_keyed_batch(_keyed)
    assert not takes_keyed_batch(_plain)
    assert not takes_keyed_batch(_bare)
    assert not takes_keyed_batch(print)  # no signature Python can read


def test_emit_names_each_effect_by_its_source_message() -> None:
    m1, m2 = lbs.Message("1-0", {}), lbs.Message("2-0", {})
    batch = lbs.KeyedBatch("k", 5, "9-0", 0, [m1, m2], data_stream="{s-input}:k:k")
    batch.emit("out", {"a": 1}, m1)
    batch.emit("out", {"a": 2}, m1)
    batch.emit("out", {"a": 3})  # the last message by default
    assert [(e.stream, e.message_id, e.fields) for e in batch.effects] == [
        ("out", "1-0", ("a", 1)),
        ("out", "1-0", ("a", 2)),
        ("out", "2-0", ("a", 3)),
    ]


@pytest.mark.parametrize(
    "stream, fields, why",
    [
        ("", {"a": 1}, "non-empty str"),
        (b"out", {"a": 1}, "non-empty str"),
        ("out", {}, "non-empty mapping"),
        ("out", {"a": None}, "must map"),
        ("out", {"a": True}, "must map"),
        ("out", {"a\ud800": "x"}, "lone surrogate"),
        ("out", {"a": "x\udfff"}, "lone surrogate"),
        ("o\ud800", {"a": 1}, "lone surrogate"),
        ("out", {f"f{i}": i for i in range(MAX_FIELDS + 1)}, "more than the limit"),
    ],
)
def test_emit_refuses_what_cannot_be_written(stream: Any, fields: Any, why: str) -> None:
    batch = lbs.KeyedBatch("k", 5, "9-0", 0, [lbs.Message("1-0", {})], data_stream="{s-input}:k:k")
    with pytest.raises(lbs.InvalidInputError, match=why):
        batch.emit(stream, fields)
    assert batch.effects == []


def test_emit_on_a_cluster_refuses_a_stream_outside_the_keys_slot() -> None:
    from redis.crc import key_slot

    batch = lbs.KeyedBatch(
        "k",
        5,
        "9-0",
        0,
        [lbs.Message("1-0", {})],
        data_stream="{s-input}:k:k",
        slot=key_slot(b"s-input"),
    )
    batch.emit("{s-input}:out", {"a": 1})
    with pytest.raises(lbs.InvalidInputError, match=r"hash tag \({s-input}:\.\.\.\)"):
        batch.emit("out", {"a": 1})
    assert len(batch.effects) == 1


@pytest.mark.parametrize(
    "bad",
    [
        ["not a pair"],
        [("", {"a": 1})],
        [(7, {"a": 1})],
        [("k", {})],
        [("k", "a=1")],
        [("k", {"a": None})],
        [("k", {"a": True})],
        [("k", {1: "x"})],
        # What a consumer would dead-letter whole or the scripts could not copy into a dead letter:
        [("x" * 100_000, {"a": 1})],
        [("ok", {"a": 1}), ("y" * 65_510, {"a": 1})],
        [("k", {f"f{i}": i for i in range(MAX_FIELDS + 1)})],
        # Text UTF-8 cannot encode (a lone surrogate): in the key, a field name, a value.
        [("k\ud800", {"a": 1})],
        [("k", {"a\udc00": 1})],
        [("k", {"a": "\udfff"})],
        [("k", {b"a": "x\ud800y"})],
    ],
)
async def test_publish_refuses_bad_messages_before_sending(bad: list[Any]) -> None:
    pub = lbs.Publisher("redis://127.0.0.1:1/0", "svc")  # nothing is sent: no server needed
    try:
        with pytest.raises(lbs.InvalidInputError):
            await pub.publish_many(bad)
    finally:
        await pub.close()
