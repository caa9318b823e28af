"""How a client reads new work: the answer of the ``lbs_reader`` hook.

The built-in answer (a plugin named ``lbs-default-reader``, asked last) is
plain ``XREADGROUP ... >`` with the periodic XPENDING scan as the backstop.
A plugin can answer first to change how often the scan runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import require_number
from .hookspecs import hookimpl

__all__ = ["DefaultReader", "ReadStrategy"]


@dataclass(frozen=True, kw_only=True)
class ReadStrategy:
    """How often the scan runs beside the reader (``claim_min_idle`` is deprecated and ignored)."""

    #: Shown in logs and metrics labels.
    name: str
    #: Deprecated and ignored (a warning at start): reads claimed pending entries idle this
    #: long (``XREADGROUP ... CLAIM``) when lbs held entries by a lock per entry. Under the
    #: consumer lease an entry is held while its consumer's lease lives, however idle, and
    #: recovery takes a dead consumer's entries as soon as its lease is gone.
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
