"""The held table of the core: records by entry id and by stream, their computed values and keys."""

from __future__ import annotations

import gc
import pickle
from typing import Any

import pytest

import lbs
from _lbscore import Entry, EntryParser, Held, HeldTable, encode_input

from _corehelpers import held_streams

PREFIX = "lock:{svc-input}:"
CONSUMER = "redis-consumer-a"
_PARSER = EntryParser()


def table() -> HeldTable:
    return HeldTable(CONSUMER, PREFIX)


def entry(entry_id: str, stream: str, info: dict[str, Any] | None = None) -> Entry:
    """The entry as the reader parses it from the LBS."""
    (e,) = _PARSER.parse_entries([[entry_id.encode(), [b"lbs-input", encode_input(stream, info)]]])
    assert e.ok
    return e


def take(
    t: HeldTable,
    entry_id: str,
    stream: str,
    info: dict[str, Any] | None,
    retry_count: int,
    token: int,
    taken_at: float = 0.0,
) -> Held:
    return t.take(entry(entry_id, stream, info), token, retry_count, taken_at)


def test_lbs_exports_the_core_record() -> None:
    assert lbs.Held is Held


def test_take_holds_the_entry_under_its_token() -> None:
    t = table()
    e = entry("1700000000000-3", "orders-7", {"user": "u1"})
    h = t.take(e, 41, 2, 12.5)
    assert (h.entry_id, h.stream, h.info, h.retry_count, h.token, h.taken_at, h.task) == (
        "1700000000000-3",
        "orders-7",
        {"user": "u1"},
        2,
        41,
        12.5,
        None,
    )
    assert h.info is e.info  # the entry's own Info, not a copy
    assert t.get(e.id) is h and t.find("orders-7") is h


def test_take_refuses_an_entry_that_is_not_an_assignment() -> None:
    (bad,) = _PARSER.parse_entries([[b"1-0", [b"lbs-input", b"not json"]]])
    assert not bad.ok
    with pytest.raises(lbs.DataError, match="not valid JSON"):
        table().take(bad, 1, 0, 0.0)
    with pytest.raises(lbs.DataError, match="no stream"):
        table().take(Entry(), 1, 0, 0.0)
    with pytest.raises(TypeError):
        table().take(None, 1, 0, 0.0)  # type: ignore[arg-type]


def test_an_empty_info_costs_the_record_no_dict() -> None:
    # Most assignments have no Info: the record keeps none until it is read.
    h = take(table(), "1-0", "s", None, 0, 1)
    assert not any(type(r) is dict for r in gc.get_referents(h))
    assert h.info == {} and any(type(r) is dict for r in gc.get_referents(h))


def test_taken_before_lists_the_records_taken_earlier_oldest_first() -> None:
    t = table()
    a, b, _ = (take(t, f"{i}-0", f"s{i}", None, 0, i, taken_at=float(i)) for i in (1, 2, 3))
    assert t.taken_before(3.0) == [a, b] and t.taken_before(1.0) == []


def test_value_and_lock_key_are_computed_from_token_consumer_and_prefix() -> None:
    t = table()
    h = take(t, "1700000000000-3", "orders-7", {"user": "u1"}, 2, 41)
    assert h.value == f"41:{CONSUMER}"
    assert h.lock_key == PREFIX + h.entry_id  # the table's consumer id and lock prefix


def test_empty_info_reads_as_a_dict_that_keeps_changes() -> None:
    h = take(table(), "1-0", "s", {}, 0, 1)
    assert h.info == {}
    h.info["seen"] = True
    assert h.info == {"seen": True}
    assert take(table(), "2-0", "s", None, 0, 1).info == {}


def test_task_is_the_only_writable_field() -> None:
    h = take(table(), "1-0", "s", {}, 0, 1)
    h.task = None
    for name in ("entry_id", "stream", "info", "retry_count", "token", "value", "lock_key"):
        with pytest.raises(AttributeError):
            setattr(h, name, getattr(h, name))


def test_constructor_takes_the_old_positional_fields_and_checks_they_agree() -> None:
    h = Held("5-0", "s", {}, 1, 1005, "1005:redis-consumer-b", PREFIX + "5-0")
    assert (h.value, h.lock_key, h.retry_count) == ("1005:redis-consumer-b", PREFIX + "5-0", 1)
    with pytest.raises(lbs.DataError, match="token"):
        Held("5-0", "s", {}, 1, 1005, "105:redis-consumer-b", PREFIX + "5-0")
    with pytest.raises(lbs.DataError, match="entry id"):
        Held("5-0", "s", {}, 1, 1005, "1005:redis-consumer-b", PREFIX + "6-0")
    with pytest.raises(OverflowError):
        Held("5-0", "s", {}, 0, 2**63, f"{2**63}:c", PREFIX + "5-0")


def test_repr_and_pickle() -> None:
    h = take(table(), "1-0", "s", {"a": 1}, 0, 9)
    assert repr(h) == (
        f"Held(entry_id='1-0', stream='s', info={{'a': 1}}, retry_count=0, token=9, "
        f"value='9:{CONSUMER}', lock_key='{PREFIX}1-0')"
    )
    again = pickle.loads(pickle.dumps(h))
    assert (again.entry_id, again.stream, again.info, again.token, again.value, again.lock_key) == (
        h.entry_id,
        h.stream,
        h.info,
        h.token,
        h.value,
        h.lock_key,
    )


def test_add_get_drop_len_contains_iteration() -> None:
    t = table()
    a = take(t, "1-0", "s1", {}, 0, 1)
    b = take(t, "2-0", "s2", {}, 0, 2)
    assert len(t) == 2 and t and "1-0" in t and "3-0" not in t
    assert list(t) == ["1-0", "2-0"]
    assert t.values() == [a, b]
    assert t.get("2-0") is b and t.get("3-0") is None and t.get("3-0", a) is a
    assert t.drop(a) is True
    assert t.drop(a) is False  # no longer held
    assert list(t) == ["2-0"] and t.find("s1") is None and held_streams(t) == 1
    assert t.drop(b) and not t and len(t) == 0 and held_streams(t) == 0


def test_drop_of_a_stale_record_keeps_the_current_one() -> None:
    t = table()
    old = take(t, "1-0", "s", {}, 0, 1)
    new = take(t, "1-0", "s", {}, 0, 2)  # the same entry taken again: replaces
    assert len(t) == 1 and t.get("1-0") is new and t.for_stream("s") == [new]
    assert t.drop(old) is False
    assert t.get("1-0") is new


def test_by_stream_keeps_every_entry_of_a_name_oldest_first() -> None:
    t = table()
    a = take(t, "1-0", "dup", {}, 0, 1)
    other = take(t, "2-0", "other", {}, 0, 2)
    b = take(t, "3-0", "dup", {}, 0, 3)
    c = take(t, "4-0", "dup", {}, 0, 4)
    assert t.for_stream("dup") == [a, b, c] and held_streams(t) == 2
    assert t.find("dup") is a
    assert t.find("dup", "3-0") is b
    assert t.find("other", "3-0") is None  # held, but for another stream
    assert t.find("dup", "9-0") is None
    assert t.drop(b)
    assert t.for_stream("dup") == [a, c]
    assert t.drop(a)
    assert t.for_stream("dup") == [c] and t.find("dup") is c
    assert t.drop(c)
    assert t.for_stream("dup") == [] and t.find("dup") is None
    assert t.for_stream("other") == [other]


def test_for_stream_is_a_copy() -> None:
    t = table()
    take(t, "1-0", "dup", {}, 0, 1)
    take(t, "2-0", "dup", {}, 0, 2)
    t.for_stream("dup").clear()
    assert len(t.for_stream("dup")) == 2


def test_a_record_built_by_hand_can_be_added() -> None:
    t = table()
    h = Held("7-0", "s", {}, 0, 3, "3:redis-consumer-z", PREFIX + "7-0")
    t.add(h)
    assert t.find("s") is h and h.value == "3:redis-consumer-z"
