from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

import lbs


def test_defaults_are_the_documented_ones() -> None:
    c = lbs.Config()
    assert (
        c.lock_ttl,
        c.heartbeat_every,
        c.max_retries,
        c.read_retry_initial,
        c.read_retry_max,
        c.read_max_retries,
        c.field_prefix,
    ) == (10.0, pytest.approx(10.0 / 3), 3, 0.1, 30.0, -1, "_")
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
        ({"drain_timeout": float("nan")}, "drain_timeout"),
        ({"drain_timeout": True}, "drain_timeout"),
        ({"recovery": "false"}, "recovery"),
        ({"keyspace_recovery": 0}, "keyspace_recovery"),
        ({"configure_keyspace_events": None}, "configure_keyspace_events"),
    ],
)
def test_invalid_values_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(lbs.ConfigurationError, match=field):
        lbs.Config(**changes)  # type: ignore[arg-type]


def test_replace_validates_again() -> None:
    assert lbs.Config().replace(lock_ttl=3.0).heartbeat_every == 1.0
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


def test_a_misspelt_field_is_a_configuration_error_with_the_likely_name() -> None:
    with pytest.raises(
        lbs.ConfigurationError, match=r"^Config has no field 'lock_tll'; did you mean 'lock_ttl'\?$"
    ):
        lbs.Config(lock_tll=5)  # type: ignore[call-arg]
    with pytest.raises(
        lbs.ConfigurationError, match=r"^Config has no field 'colour'$"
    ):  # nothing close
        lbs.Config(colour="blue")  # type: ignore[call-arg]
    with pytest.raises(lbs.ConfigurationError, match="did you mean 'max_streams'"):
        lbs.Config().replace(max_stream=5)
    with pytest.raises(ValueError):  # a ConfigurationError is also a ValueError
        lbs.Config(lock_tll=5)  # type: ignore[call-arg]


def test_positional_arguments_are_a_configuration_error() -> None:
    with pytest.raises(lbs.ConfigurationError, match=r"keyword arguments only.*1 positional: 5"):
        lbs.Config(5)  # type: ignore[misc]


def test_config_stays_a_frozen_keyword_only_dataclass() -> None:
    c = lbs.Config(lock_ttl=4.0, max_streams=7)
    assert dataclasses.is_dataclass(c) and c.__dataclass_params__.frozen  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.lock_ttl = 1.0  # type: ignore[misc]
    params = inspect.signature(lbs.Config).parameters
    assert "lock_ttl" in params and all(p.kind is p.KEYWORD_ONLY for p in params.values())
    assert c.replace(max_streams=8) == lbs.Config(lock_ttl=4.0, max_streams=8)
    assert pickle.loads(pickle.dumps(c)) == c


def test_disabled_plugins_that_is_not_a_sequence_is_a_configuration_error() -> None:
    with pytest.raises(lbs.ConfigurationError, match=r"disabled_plugins.*got 5"):
        lbs.Config(disabled_plugins=5)  # type: ignore[arg-type]
