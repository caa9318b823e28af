"""Fixtures shared by the integration tests (the servers themselves are in the root conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis


@pytest.fixture
async def rr(any_server: Any) -> AsyncIterator[aioredis.Redis]:
    """A redis-py client on ``any_server``: the test runs on Redis 8.x, then on Debian's 7.0."""
    async with aioredis.Redis.from_url(any_server.url) as c:
        yield c
