"""Pure logic of keyed processing: a keyed handler's detection, KeyedBatch.emit's idempotency ids,
the Publisher's refusals (before anything is sent)."""

from __future__ import annotations

from typing import Any

import pytest

import lbs
from lbs.cli.worker import takes_keyed_batch


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
    assert [(e.producer, e.iid, e.fields) for e in batch.effects] == [
        ("{s-input}:k:k", "1-0:0", ("a", 1)), ("{s-input}:k:k", "1-0:1", ("a", 2)),
        ("{s-input}:k:k", "2-0:0", ("a", 3))]


@pytest.mark.parametrize("bad", [
    ["not a pair"], [("", {"a": 1})], [(7, {"a": 1})], [("k", {})], [("k", "a=1")], [("k", {"a": None})],
    [("k", {"a": True})], [("k", {1: "x"})],
])
async def test_publish_refuses_bad_messages_before_sending(bad: list[Any]) -> None:
    pub = lbs.Publisher("redis://127.0.0.1:1/0", "svc")  # nothing is sent: no server needed
    try:
        with pytest.raises(lbs.InvalidInputError):
            await pub.publish_many(bad)
    finally:
        await pub.close()
