"""What a streaming query's sink wrote, kept in Redis: a batch Spark runs again after a restart,
however late, writes nothing twice.

Spark runs again, after a restart, the micro-batch whose commit its checkpoint does not record, with
the same batch id and, for a deterministic query, the same rows in each partition (what XADD IDMP
needs too; IDMP alone forgets after ``idmpDuration``). The sink keeps, per query (its run tag: the
query's id) in the service's slot (``{<service>-input}``, beside the LBS):

* ``{<service>-input}:spark:<query>:<batch>``, a sorted set: member a partition, score how many of
  its rows Redis has acknowledged, raised (``ZADD GT``) after each round of the partition's write
  and at its end. A task of that batch run again skips that many rows: it encodes them without
  sending them, so the rows it does send carry the IDMP ids of the first run (a round in flight at
  a kill is then deduplicated by IDMP within its window; on Redis 7.x, without IDMP, it is written
  again: at most the rows of two rounds a partition).
* ``{<service>-input}:spark:<query>``, a hash: ``committed`` is the last batch whose commit ran (its
  registrations XADDed to the LBS), set in the same ``MULTI``/``EXEC`` as those XADDs, so a commit run
  again registers nothing; the same transaction deletes the previous batch's partition marks (once
  batch N commits, Spark never runs N - 1 again), so a query keeps one or two batches' marks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from .. import _keys
from .._redis.errors import WrongTypeError, classify
from ..exceptions import ConfigurationError

T = TypeVar("T")

__all__ = ["Ledger"]


@dataclass(frozen=True)
class Ledger:
    """One streaming query's record of one micro-batch (pickled to the executors with the writer)."""

    service: str
    query: str
    batch: int

    @property
    def query_key(self) -> str:
        return f"{_keys.key_prefix(self.service)}spark:{self.query}"

    def batch_key(self, batch: int | None = None) -> str:
        return f"{self.query_key}:{self.batch if batch is None else batch}"

    def written(self, client: Any, partition: int) -> int:
        """How many rows of ``partition`` an earlier run of this batch had acknowledged (0: none)."""
        key = self.batch_key()
        score = self._checked(key, lambda: client.zscore(key, str(partition)))
        return int(score or 0)

    def mark(self, batch: Any, partition: int, rows: int) -> None:
        """Queue, into the ``CommandBatch`` ``batch`` of the node that owns the marks, that ``rows``
        rows of ``partition`` are acknowledged."""
        batch.command("ZADD", self.batch_key(), "GT", rows, str(partition))

    def committed(self, client: Any) -> bool:
        """Whether this batch's commit already ran (in an earlier run of the query)."""
        last = self._checked(self.query_key, lambda: client.hget(self.query_key, "committed"))
        if last is not None and not last.isdigit():
            raise self._foreign(self.query_key, f"its field 'committed' holds {last!r}")
        return last is not None and int(last) >= self.batch

    def commit(self, client: Any, lbs_stream: str, registrations: list[bytes]) -> None:
        """Register the data streams (encoded ``lbs-input`` values) in the LBS and record the commit, in one
        transaction (every key in the LBS's slot)."""
        pipe = client.pipeline(transaction=True)
        for value in registrations:
            pipe.xadd(lbs_stream, {_keys.INPUT_FIELD: value})
        pipe.hset(self.query_key, "committed", self.batch)
        if self.batch > 0:
            pipe.delete(self.batch_key(self.batch - 1))
        pipe.execute()

    def _checked(self, key: str, read: Callable[[], T]) -> T:
        """``read()``, a key of the record that holds another type being the caller's error."""
        try:
            return read()
        except redis.ResponseError as exc:
            if isinstance(classify(exc), WrongTypeError):
                raise self._foreign(key, str(exc)) from exc
            raise

    def _foreign(self, key: str, what: str) -> ConfigurationError:
        return ConfigurationError(
            f"{key!r} is not the lbs sink's record of query {self.query!r} ({what}): delete it, "
            "or give the query another runTag"
        )
