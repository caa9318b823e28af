"""The streaming sink's record in Redis, read by the sink: a key of it that something else wrote is
an lbs error naming the key, not a Redis error from deep inside a Spark task."""

from __future__ import annotations

from typing import Any

import pytest
import redis

pytest.importorskip("pyspark", reason="the Spark tests need the lbs-streams[spark] extra")

from lbs import ConfigurationError
from lbs.spark._ledger import Ledger


def test_a_record_key_of_another_type_is_named(redis_server: Any, service: str) -> None:
    ledger = Ledger(service, "q1", 3)
    with redis.Redis.from_url(redis_server.url, decode_responses=False) as r:
        assert ledger.written(r, 0) == 0 and not ledger.committed(r)
        r.set(ledger.batch_key(), "x")
        with pytest.raises(ConfigurationError, match="is not the lbs sink's record of query 'q1'"):
            ledger.written(r, 0)
        r.set(ledger.query_key, "x")
        with pytest.raises(ConfigurationError, match=ledger.query_key):
            ledger.committed(r)
        r.delete(ledger.query_key)
        r.hset(ledger.query_key, "committed", "soon")
        with pytest.raises(ConfigurationError, match="'committed' holds"):
            ledger.committed(r)
        r.delete(ledger.query_key, ledger.batch_key())
