"""lbs.logs: the JSON formatter and ``configure`` (pure logic: records in, lines out)."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

import lbs
from lbs._consumer.state import ConsumerLog
from lbs.logs import JsonFormatter, about, configure


class _Held:
    stream, entry_id, token, retry_count = "s-7", "1764064862344-0", 1795590772764793, 2


def _line(stream: io.StringIO) -> dict[str, Any]:
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1, lines  # one object per line, nothing else
    out: dict[str, Any] = json.loads(lines[0])
    return out


@pytest.fixture
def out() -> Any:
    buf = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    configure("DEBUG", "json", buf)
    yield buf
    root.handlers[:], level = saved
    root.setLevel(level)


def test_a_record_about_an_assignment_has_its_fields(out: io.StringIO) -> None:
    log = ConsumerLog(logging.getLogger("lbs.client"), {"consumer_id": "c-1", "service": "orders"})
    log.on(_Held()).warning("handler failed on %s", "s-7")
    line = _line(out)
    assert (
        line["message"] == "handler failed on s-7"
    )  # the text format's [consumer] prefix is a field
    assert line["level"] == "WARNING" and line["logger"] == "lbs.client"
    assert (line["consumer"], line["service"], line["stream"]) == ("c-1", "orders", "s-7")
    assert (line["entry_id"], line["token"], line["retry_count"]) == (
        "1764064862344-0",
        1795590772764793,
        2,
    )
    assert "key" not in line and "traceback" not in line
    assert line["time"].endswith("Z") and isinstance(line["pid"], int)


def test_a_keyed_record_names_the_key(out: io.StringIO) -> None:
    log = ConsumerLog(logging.getLogger("lbs.client"), {"consumer_id": "c-1", "service": "t"})
    log.on(_Held(), keyed=True).info("key %s let go", "s-7")
    line = _line(out)
    assert line["key"] == "s-7" and "stream" not in line


def test_a_failure_keeps_its_whole_traceback(out: io.StringIO) -> None:
    def handler() -> None:
        raise ValueError("bad\nsecond line")

    try:
        handler()
    except ValueError:
        logging.getLogger("lbs.client").exception("failed", extra=about(_Held()))
    line = _line(out)  # a multi-line message and traceback still make one line
    assert line["error"] == "ValueError: bad\nsecond line"
    assert line["traceback"].startswith("Traceback (most recent call last):")
    assert "in handler" in line["traceback"] and line["traceback"].endswith("second line")


def test_a_value_json_cannot_hold_is_written_as_its_str(out: io.StringIO) -> None:
    logging.getLogger("x").info("m", extra={"stream": object(), "banner": {"a": b"b"}})
    line = _line(out)
    assert line["stream"].startswith("<object object") and line["banner"] == {"a": "b'b'"}


def test_configure_replaces_the_root_handlers_and_refuses_an_unknown_format() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        buf = io.StringIO()
        handler = configure("warning", "text", buf)
        assert root.handlers == [handler] and root.level == logging.WARNING
        assert not isinstance(handler.formatter, JsonFormatter)
        logging.getLogger("lbs").info("hidden")
        logging.getLogger("lbs").warning("shown")
        assert buf.getvalue().splitlines()[0].endswith("WARNING lbs: shown")
        with pytest.raises(lbs.ConfigurationError, match="'text' or 'json'"):
            configure(fmt="xml")  # type: ignore[arg-type]
        assert root.handlers == [handler]
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
