"""What a client says at start about server settings that put its keys at risk."""

from __future__ import annotations

import logging

import pytest

import lbs
from lbs.embedded import RedisServer

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    "policy, level, says",
    [
        ("allkeys-lru", logging.WARNING, "may evict the LBS itself"),
        ("volatile-ttl", logging.INFO, "may evict live consumers' leases"),
        ("noeviction", None, None),
    ],
)
async def test_a_start_names_an_eviction_policy_that_may_take_lbs_keys(
    service: str, caplog: pytest.LogCaptureFixture, policy: str, level: int | None, says: str | None
) -> None:
    caplog.set_level(logging.INFO, logger="lbs")
    with RedisServer(config={"maxmemory-policy": policy}) as srv:
        c = lbs.Client(
            srv.url,
            service,
            consumer_id="c",
            load_entrypoint_plugins=False,
            config=lbs.Config(configure_keyspace_events=False),
        )
        try:
            await c.start()
        finally:
            await c.close()
    said = [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    if says is None:
        assert said == []
    else:
        (record,) = said
        assert (
            record.levelno == level
            and policy in record.getMessage()
            and says in record.getMessage()
        )
        if level == logging.WARNING:
            assert "Persistence and eviction" in record.getMessage()
