"""Plugins contributing Config defaults (hook lbs_config_defaults); no server needed."""

from __future__ import annotations

from typing import Any

import pytest

import lbs


class Defaults:
    def __init__(self, **values: Any) -> None:
        self.values = values

    @lbs.hookimpl
    def lbs_config_defaults(self) -> dict[str, Any]:
        return self.values


def make(*plugins: object, config: lbs.Config | None = None) -> lbs.Client:
    return lbs.Client(
        "redis://127.0.0.1:1", "svc", "c", config, plugins=plugins, load_entrypoint_plugins=False
    )


def test_defaults_apply_when_no_config_is_given() -> None:
    c = make(Defaults(max_streams=7, lock_ttl=5.0), Defaults(max_streams=7))
    assert (c.config.max_streams, c.config.lock_ttl) == (7, 5.0)


def test_an_explicit_config_wins_whole() -> None:
    c = make(Defaults(max_streams=7), config=lbs.Config(read_count=3))
    assert (c.config.max_streams, c.config.read_count) == (lbs.Config().max_streams, 3)


def test_disagreeing_plugins_and_unknown_fields_are_refused_by_name() -> None:
    with pytest.raises(
        lbs.ConfigurationError, match=r"disagree on the default of Config\.max_streams"
    ):
        make(Defaults(max_streams=7), Defaults(max_streams=8))
    with pytest.raises(lbs.ConfigurationError, match="'no_such_field'"):
        make(Defaults(no_such_field=1))
    with pytest.raises(lbs.ConfigurationError, match="'disabled_plugins'"):
        make(Defaults(disabled_plugins=("x",)))
    with pytest.raises(lbs.ConfigurationError, match="max_streams"):
        make(Defaults(max_streams=0))  # and the values are validated like any Config
