"""Type-checked (never run) uses of the public API; assert_type pins what users see."""

from __future__ import annotations

from typing import Any

from typing_extensions import assert_type

import lbs
from lbs.embedded import RedisServer


async def producer_example(url: str) -> None:
    async with lbs.Producer(url, "orders") as producer:
        assert_type(await producer.add_stream("session-1", {"user": "u1"}), str)
        assert_type(await producer.add_streams(["a", ("b", {"k": 1}), ("c", None)]), list[str])


def codec_example(raw: bytes) -> None:
    assert_type(lbs.encode_input("s", {"k": 1}), bytes)
    assert_type(lbs.decode_input(raw), tuple[str, dict[str, Any]])
    name, _info, reason = lbs.try_decode_input(raw)
    if reason is None:
        assert_type(name, str | None)
    assert_type(lbs.lease_key("svc", "1-0"), str)


def errors_example() -> None:
    try:
        lbs.decode_input(b"")
    except lbs.InvalidInputError as exc:
        assert_type(exc, lbs.InvalidInputError)
        e: lbs.LbsError = exc
        v: ValueError = exc
        del e, v


def embedded_example() -> None:
    with RedisServer() as server:
        assert_type(server.url, str)
        assert_type(server.version, tuple[int, ...])
