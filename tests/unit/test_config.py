from __future__ import annotations

import pytest

import lbs


def test_defaults_are_the_documented_ones() -> None:
    c = lbs.Config()
    assert (c.lock_ttl, c.heartbeat_every, c.max_retries, c.read_retry_initial, c.read_retry_max,
            c.read_max_retries, c.field_prefix) == (10.0, 5.0, 3, 0.1, 30.0, -1, "_")
    assert c.dead_letter_stream is None  # the service's {<service>-input}:dlq


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"lock_ttl": 0}, "lock_ttl"),
        ({"lock_ttl": float("nan")}, "lock_ttl"),
        ({"heartbeat_interval": 10.0}, "heartbeat_interval"),
        ({"max_streams": 0}, "max_streams"),
        ({"read_count": True}, "read_count"),
        ({"read_max_retries": -2}, "read_max_retries"),
        ({"read_retry_initial": 5.0, "read_retry_max": 1.0}, "read_retry_max"),
        ({"field_prefix": ""}, "field_prefix"),
        ({"drain_timeout": -1}, "drain_timeout"),
    ],
)
def test_invalid_values_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(lbs.ConfigurationError, match=field):
        lbs.Config(**changes)  # type: ignore[arg-type]


def test_replace_validates_again() -> None:
    assert lbs.Config().replace(lock_ttl=2.0).heartbeat_every == 1.0
    with pytest.raises(lbs.ConfigurationError):
        lbs.Config().replace(max_streams=-1)


def test_consumer_id_follows_the_go_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.delenv("POD_IP", raising=False)
    with pytest.raises(lbs.ConfigurationError, match="POD_NAME"):
        lbs.consumer_id_from_env()
    monkeypatch.setenv("POD_IP", "10.0.0.7")
    assert lbs.consumer_id_from_env() == "redis-consumer-10.0.0.7"
    monkeypatch.setenv("POD_NAME", "worker-0")
    assert lbs.consumer_id_from_env() == "redis-consumer-worker-0"
    assert lbs.consumer_id_from_env("me") == "redis-consumer-me"
    assert lbs.consumer_id_from_env("redis-consumer-me") == "redis-consumer-me"
    with pytest.raises(lbs.ConfigurationError):
        lbs.consumer_id_from_env("two words")


def test_disabled_plugins_are_entry_point_names() -> None:
    assert lbs.Config(disabled_plugins=["prometheus"]).disabled_plugins == ("prometheus",)
    with pytest.raises(lbs.ConfigurationError, match="disabled_plugins"):
        lbs.Config(disabled_plugins="prometheus")  # type: ignore[arg-type]
    with pytest.raises(lbs.ConfigurationError, match="disabled_plugins"):
        lbs.Config(disabled_plugins=(1,))  # type: ignore[arg-type]
