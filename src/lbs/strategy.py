"""How a client reads new work: the answer of the ``lbs_reader`` hook.

The built-in answer (a plugin named ``lbs-default-reader``, asked last) is
plain ``XREADGROUP ... >`` with the periodic XPENDING scan as the backstop.
A plugin can answer first, e.g. ``lbs-claim``'s XREADGROUP ... CLAIM reader
for Redis 8.4+, which brings idle pending assignments back in the same
round trip as new ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import require_number
from .hookspecs import hookimpl

__all__ = ["DefaultReader", "ReadStrategy"]


@dataclass(frozen=True, kw_only=True)
class ReadStrategy:
    """What ``read-3.lua``'s XREADGROUP asks for, and how often the scan runs beside it."""

    #: Shown in logs and metrics labels.
    name: str
    #: Also claim pending entries idle at least this many seconds, in the same
    #: read (``XREADGROUP ... CLAIM``, Redis >= 8.4). A claimed entry is only
    #: taken when its lock can be; its delivery count then counts failed
    #: attempts (with ``_retry_count``) towards ``Config.max_retries``.
    #: ``None``: new entries only.
    claim_min_idle: float | None = None
    #: How often the full XPENDING scan runs with this reader; ``None`` keeps
    #: ``Config.reconciliation_interval``.
    reconciliation_interval: float | None = None

    def __post_init__(self) -> None:
        for name in ("claim_min_idle", "reconciliation_interval"):
            v = getattr(self, name)
            if v is not None:
                require_number(
                    v,
                    f"ReadStrategy.{name} must be a positive number or None",
                    above=True,
                    finite=True,
                )

    @property
    def claim_min_idle_ms(self) -> int | None:
        return None if self.claim_min_idle is None else max(1, int(self.claim_min_idle * 1000))


class DefaultReader:
    """The built-in reader: new entries only; the scan is the backstop."""

    @hookimpl(trylast=True)
    def lbs_reader(self) -> ReadStrategy:
        return ReadStrategy(name="default")
