"""The one table from Redis's error replies to exception classes (lbs._redis.errors)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from redis.exceptions import (
    BusyLoadingError,
    ConnectionError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
)

from lbs._redis import errors
from lbs._redis.acl import denied_rule
from lbs._redis.connection import redirected
from lbs._redis.errors import (
    ERR_REPLIES,
    REPLY_ERRORS,
    BusyGroupError,
    KeyTypeError,
    NoGroupError,
    NoSuchKeyError,
    WrongTypeError,
    classify,
    replied,
    reply_error,
)

LUA = Path(errors.__file__).parent / "lua"


@pytest.mark.parametrize("code", sorted(REPLY_ERRORS))
def test_every_prefix_maps_to_its_class_with_the_message_kept(code: str) -> None:
    message = f"{code} something went wrong: {{s-input}}:lock:7"
    exc = reply_error(message)
    assert type(exc) is REPLY_ERRORS[code]
    assert str(exc) == message and exc.args == (message,)


@pytest.mark.parametrize("text", sorted(ERR_REPLIES))
def test_err_replies_map_by_their_whole_text(text: str) -> None:
    exc = reply_error(f"ERR {text}")
    assert type(exc) is ERR_REPLIES[text] and str(exc) == f"ERR {text}"


@pytest.mark.parametrize(
    "message",
    [
        "ERR lbs read-3: COUNT (ARGV[3]) must be an integer >= 1",
        "ERR no such key, or something else",
        "NOTAPREFIX x",
        "",
        "lbskey lowercase is not the prefix",
        "LBSKEYS no space after the prefix",
    ],
)
def test_an_unknown_reply_is_a_plain_response_error(message: str) -> None:
    exc = reply_error(message)
    assert type(exc) is ResponseError and str(exc) == message


def test_the_classes_keep_redis_py_catches_working() -> None:
    for code, cls in REPLY_ERRORS.items():
        if code == "LOADING":  # "not yet", like a refused connection: redis-py's own
            assert cls is BusyLoadingError and issubclass(cls, ConnectionError)
        else:
            assert issubclass(cls, ResponseError), code
    assert REPLY_ERRORS["NOSCRIPT"] is NoScriptError
    assert REPLY_ERRORS["NOPERM"] is NoPermissionError
    assert all(issubclass(cls, ResponseError) for cls in ERR_REPLIES.values())


def test_every_error_prefix_the_scripts_send_is_in_the_table() -> None:
    sent = set()
    for path in LUA.glob("*.lua"):
        source = path.read_text()
        sent |= set(re.findall(r"error_reply\('([A-Z]+) ", source))
        sent |= set(re.findall(r"return '([A-Z]+) ' \.\.", source))  # _checks.lua's refusal text
    assert {"ERR", "LBSKEY", "NOPERM"} <= sent
    assert sent - {"ERR"} <= set(REPLY_ERRORS), sent - set(REPLY_ERRORS)


@pytest.mark.parametrize(
    "message, cls",
    [
        ("NOGROUP No such key 's' or consumer group 'g'", NoGroupError),
        ("BUSYGROUP Consumer Group name already exists", BusyGroupError),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", WrongTypeError),
        ("LBSKEY {s-input}:due holds a string, not the due index", KeyTypeError),
        ("no such key", NoSuchKeyError),  # redis-py drops "ERR "
        (
            "Command # 1 (GET {s-input}:c1) of pipeline caused error: "
            "('WRONGTYPE Operation against a key holding the wrong kind of value',)",
            WrongTypeError,
        ),
    ],
)
def test_classify_reads_redis_py_replies_through_the_same_table(
    message: str, cls: type[ResponseError]
) -> None:
    cause = ValueError("underneath")
    original = ResponseError(message)
    original.__cause__ = cause
    out = classify(original)
    assert type(out) is cls and str(out) == message and out.__cause__ is cause


@pytest.mark.parametrize(
    "exc",
    [
        ResponseError("something else"),
        ResponseError("LOADING Redis is loading"),  # never turns a ResponseError into another kind
        NoScriptError("No matching script"),
        ValueError("NOGROUP in another error"),
        KeyTypeError("LBSKEY x holds a list, not y"),
    ],
)
def test_classify_leaves_the_rest_alone(exc: BaseException) -> None:
    assert classify(exc) is exc


def test_replied_raises_the_classified_error() -> None:
    async def fails(message: str) -> None:
        raise ResponseError(message)

    async def ok() -> int:
        return 7

    async def main() -> None:
        assert await replied(ok()) == 7
        with pytest.raises(BusyGroupError, match=r"^BUSYGROUP Consumer"):
            await replied(fails("BUSYGROUP Consumer Group name already exists"))
        with pytest.raises(ResponseError, match=r"^other") as info:
            await replied(fails("other"))
        assert type(info.value) is ResponseError

    asyncio.run(main())


@pytest.mark.parametrize(
    "message, moved",
    [
        ("MOVED 3999 127.0.0.1:6381", True),
        ("ASK 3999 127.0.0.1:6381", True),
        ("READONLY You can't write against a read only replica.", True),
        ("CLUSTERDOWN The cluster is down", True),
        ("MASTERDOWN Link with MASTER is down", True),
        ("TRYAGAIN Multiple keys request during rehashing of slot", True),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
        ("ERR unknown command", False),
    ],
)
def test_a_redirect_from_lbss_own_batches_is_told_by_its_class(message: str, moved: bool) -> None:
    assert redirected(reply_error(message)) is moved


def test_an_acl_denial_from_lbss_own_batches_reads_its_rule() -> None:
    exc = reply_error("NOPERM lbs read-3: the ACL does not allow XREADGROUP {s-input} ...")
    assert isinstance(exc, NoPermissionError) and denied_rule(exc) == "+xreadgroup"
