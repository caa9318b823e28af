"""The held table of the core: records by entry id and by stream, computed lock values and keys,
and the heartbeat's EVALSHA written straight from the records."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import lbs
from _lbscore import CommandBatch, Held, HeldTable

PREFIX = "lock:{svc-input}:"
CONSUMER = "redis-consumer-a"


def table() -> HeldTable:
    return HeldTable(CONSUMER, PREFIX)


def test_lbs_exports_the_core_record() -> None:
    assert lbs.Held is Held


def test_value_and_lock_key_are_computed_from_token_consumer_and_prefix() -> None:
    t = table()
    h = t.add_new("1700000000000-3", "orders-7", {"user": "u1"}, 2, 41)
    assert (h.entry_id, h.stream, h.info, h.retry_count, h.token, h.task) == \
        ("1700000000000-3", "orders-7", {"user": "u1"}, 2, 41, None)
    assert h.value == f"41:{CONSUMER}"
    assert h.lock_key == lbs.lock_key("svc", "1700000000000-3")
    assert (t.consumer_id, t.lock_prefix) == (CONSUMER, PREFIX)


def test_empty_info_reads_as_a_dict_that_keeps_changes() -> None:
    h = table().add_new("1-0", "s", {}, 0, 1)
    assert h.info == {}
    h.info["seen"] = True
    assert h.info == {"seen": True}
    assert table().add_new("2-0", "s", None, 0, 1).info == {}


def test_task_is_the_only_writable_field() -> None:
    h = table().add_new("1-0", "s", {}, 0, 1)
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
    h = table().add_new("1-0", "s", {"a": 1}, 0, 9)
    assert repr(h) == (f"Held(entry_id='1-0', stream='s', info={{'a': 1}}, retry_count=0, token=9, "
                       f"value='9:{CONSUMER}', lock_key='{PREFIX}1-0')")
    again = pickle.loads(pickle.dumps(h))
    assert (again.entry_id, again.stream, again.info, again.token, again.value, again.lock_key) == \
        (h.entry_id, h.stream, h.info, h.token, h.value, h.lock_key)


def test_add_get_drop_len_contains_iteration() -> None:
    t = table()
    a = t.add_new("1-0", "s1", {}, 0, 1)
    b = t.add_new("2-0", "s2", {}, 0, 2)
    assert len(t) == 2 and t and "1-0" in t and "3-0" not in t
    assert list(t) == ["1-0", "2-0"]
    assert t.values() == [a, b]
    assert t.get("2-0") is b and t.get("3-0") is None and t.get("3-0", a) is a
    assert t.drop(a) is True
    assert t.drop(a) is False  # no longer held
    assert list(t) == ["2-0"] and t.find("s1") is None and t.streams() == 1
    assert t.drop(b) and not t and len(t) == 0 and t.streams() == 0


def test_drop_of_a_stale_record_keeps_the_current_one() -> None:
    t = table()
    old = t.add_new("1-0", "s", {}, 0, 1)
    new = t.add_new("1-0", "s", {}, 0, 2)  # the same entry taken again: replaces
    assert len(t) == 1 and t.get("1-0") is new and t.for_stream("s") == [new]
    assert t.drop(old) is False
    assert t.get("1-0") is new


def test_by_stream_keeps_every_entry_of_a_name_oldest_first() -> None:
    t = table()
    a = t.add_new("1-0", "dup", {}, 0, 1)
    other = t.add_new("2-0", "other", {}, 0, 2)
    b = t.add_new("3-0", "dup", {}, 0, 3)
    c = t.add_new("4-0", "dup", {}, 0, 4)
    assert t.for_stream("dup") == [a, b, c] and t.streams() == 2
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
    t.add_new("1-0", "dup", {}, 0, 1)
    t.add_new("2-0", "dup", {}, 0, 2)
    t.for_stream("dup").clear()
    assert len(t.for_stream("dup")) == 2


def test_a_record_built_by_hand_can_be_added() -> None:
    t = table()
    h = Held("7-0", "s", {}, 0, 3, "3:redis-consumer-z", PREFIX + "7-0")
    t.add(h)
    assert t.find("s") is h and h.value == "3:redis-consumer-z"


def _expected(records: list[Held], start: int, stop: int) -> bytes:
    b = CommandBatch()
    part = records[start:stop]
    b.evalsha_locks("f" * 40, ("lbs", "{lbs}:consumers"), PREFIX.encode(), [h.entry_id for h in part],
                    (600_000, "group", CONSUMER, 1), [h.value for h in part])
    return b.getvalue()


@given(st.lists(st.tuples(st.integers(0, 2**48), st.integers(0, 2**20), st.integers(-(2**63), 2**63 - 1)),
                min_size=1, max_size=40, unique_by=lambda x: (x[0], x[1])),
       st.data())
def test_encode_extend_writes_what_evalsha_locks_writes(entries: list[tuple[int, int, int]],
                                                        data: st.DataObject) -> None:
    t = table()
    for ms, seq, token in entries:
        t.add_new(f"{ms}-{seq}", f"s{ms}é", {}, 0, token)
    records = t.values()
    start = data.draw(st.integers(0, len(records)))
    stop = data.draw(st.integers(start, len(records)))
    b = CommandBatch()
    t.encode_extend(b, "f" * 40, ("lbs", "{lbs}:consumers"), (600_000, "group", CONSUMER, 1), records, start, stop)
    assert len(b) == 1
    assert b.getvalue() == _expected(records, start, stop)


def test_encode_extend_uses_each_records_own_keys() -> None:
    t = table()
    t.add_new("1-0", "s", {}, 0, 1)
    t.add(Held("2-0", "s", {}, 0, 2, "2:redis-consumer-a", PREFIX + "2-0"))
    b = CommandBatch()
    records = t.values()
    t.encode_extend(b, "f" * 40, ("lbs", "{lbs}:consumers"), (600_000, "group", CONSUMER, 1), records, 0, 2)
    assert b.getvalue() == _expected(records, 0, 2)


def test_encode_extend_refuses_a_slice_outside_the_snapshot() -> None:
    t = table()
    t.add_new("1-0", "s", {}, 0, 1)
    with pytest.raises(lbs.DataError):
        t.encode_extend(CommandBatch(), "sha", (), (), t.values(), 0, 2)
    with pytest.raises(TypeError):
        t.encode_extend(CommandBatch(), "sha", (), (), ["1-0"], 0, 1)
