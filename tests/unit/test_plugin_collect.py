"""``lbs.plugins.collect``: every plugin's answer to a collecting hook, each called on its own."""

from __future__ import annotations

import logging

import pytest

import lbs
from lbs.plugins import collect, make_plugin_manager


class Rows:
    def __init__(self, rows: dict[str, str] | None) -> None:
        self.rows = rows

    @lbs.hookimpl
    def lbs_worker_banner(self, client: object) -> dict[str, str] | None:
        return self.rows


class Broken:
    @lbs.hookimpl
    def lbs_worker_banner(self) -> dict[str, str]:
        raise RuntimeError("no banner today")


def test_a_plugin_that_raises_is_logged_and_the_others_still_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pm = make_plugin_manager(
        [Rows({"metrics": "http://x"}), Broken(), Rows(None), Rows({"a": "b"})],
        load_entrypoints=False,
    )
    with caplog.at_level(logging.ERROR, logger="lbs.plugins"):
        answers = collect(pm, "lbs_worker_banner", client=object())
    assert answers == [
        {"a": "b"},
        {"metrics": "http://x"},
    ]  # the last registered first; None left out
    assert "raised in hook lbs_worker_banner" in caplog.text and "no banner today" in caplog.text


def test_nobody_listening_is_no_answer() -> None:
    assert (
        collect(make_plugin_manager(load_entrypoints=False), "lbs_worker_banner", client=object())
        == []
    )
