from __future__ import annotations

import pytest
from redis.crc import key_slot

import lbs


def test_names_follow_the_go_wire_format() -> None:
    assert lbs.input_stream("svc") == "svc-input"
    assert lbs.group_name("svc") == "svc-group"
    assert lbs.lease_key("svc", "redis-consumer-a") == "{svc-input}:lease:redis-consumer-a"
    assert lbs.dead_letter_stream("svc") == "{svc-input}:dlq"


@pytest.mark.parametrize("service", ["svc", "orders.eu", "a-b_c"])
def test_every_key_of_a_service_shares_one_slot(service: str) -> None:
    slots = {
        key_slot(k.encode())
        for k in (
            lbs.input_stream(service),
            lbs.lease_key(service, "redis-consumer-a"),
            lbs.dead_letter_stream(service),
        )
    }
    assert len(slots) == 1


@pytest.mark.parametrize("bad", ["", "a{b", "x}", None])
def test_service_names_that_would_break_the_hash_tag_are_refused(bad: object) -> None:
    with pytest.raises(lbs.ConfigurationError):
        lbs.Producer("redis://127.0.0.1:1", bad)  # type: ignore[arg-type]
