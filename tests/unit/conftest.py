"""Fixtures of tests/unit: the fake wire the consumer's parts talk to (``_fakewire.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from _fakewire import FakeRedis


@pytest.fixture
async def fake() -> AsyncIterator[FakeRedis]:
    """The fake wire (:class:`_fakewire.FakeRedis`), closed at teardown."""
    fake = FakeRedis()
    yield fake
    await fake.close()
