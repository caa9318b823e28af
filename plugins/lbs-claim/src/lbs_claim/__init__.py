"""lbs plugin, retired: the XREADGROUP ... CLAIM reader (Redis >= 8.4).

It made every read also claim pending assignments idle for at least ``min_idle``, when lbs held each
entry by a lock of its own. lbs now holds what a consumer reads by the consumer's lease, however long
it stays idle, and recovery takes a dead consumer's work as soon as its lease is gone: an idle-time
claim would take live work, and the fast recovery it gave is what the lease does. Installed, it steps
aside with one warning (``lbs_reader`` answers nothing); :meth:`ClaimReader.strategy` still builds the
strategy it used to answer, which lbs ignores (``ReadStrategy.claim_min_idle`` is deprecated).
"""

from __future__ import annotations

import logging
import os

import lbs

__all__ = ["MIN_SERVER", "ClaimReader", "plugin"]

#: XREADGROUP ... CLAIM arrived in Redis 8.4.0.
MIN_SERVER = (8, 4)

_log = logging.getLogger("lbs_claim")


def _env_seconds(name: str) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError:
        raise lbs.ConfigurationError(f"{name} must be a number of seconds, got {raw!r}") from None


class ClaimReader:
    """Retired: answers ``lbs_reader`` with nothing, whatever the server, after one warning that says so
    (it answered a CLAIM strategy when lbs held each entry by a lock of its own)."""

    def __init__(
        self, min_idle: float | None = None, reconciliation_interval: float | None = None
    ) -> None:
        self.min_idle = min_idle
        self.reconciliation_interval = reconciliation_interval
        self._warned = False  # the one warning that it is retired

    def strategy(self, config: lbs.Config) -> lbs.ReadStrategy:
        """The strategy for a client with ``config`` (validated against its heartbeat)."""
        min_idle = self.min_idle
        if min_idle is None:
            min_idle = _env_seconds("LBS_CLAIM_MIN_IDLE")
        if min_idle is None:
            min_idle = config.scan_min_idle
        live_bound = config.pel_refresh_every * config.heartbeat_every
        if min_idle <= live_bound:
            raise lbs.ConfigurationError(
                f"lbs-claim: min_idle {min_idle:g} s must exceed {live_bound:g} s, the longest a live holder's "
                f"entry stays idle (heartbeat every {config.heartbeat_every:g} s, idle time refreshed every "
                f"{config.pel_refresh_every} ticks); a lower threshold would claim live work"
            )
        scan = self.reconciliation_interval
        if scan is None:
            scan = _env_seconds("LBS_CLAIM_SCAN_INTERVAL")
        if scan is None:
            scan = max(600.0, config.reconciliation_interval)
        return lbs.ReadStrategy(name="claim", claim_min_idle=min_idle, reconciliation_interval=scan)

    @lbs.hookimpl
    def lbs_reader(
        self, client: lbs.Client, server_version: tuple[int, ...]
    ) -> lbs.ReadStrategy | None:
        # Retired (issue 44): lbs holds what a consumer reads by its lease, however idle, and recovery
        # takes a dead consumer's work as soon as its lease is gone; claiming idle entries would take
        # live work. Installed, it steps aside: say so once, and leave the default reader in place.
        if not self._warned:
            self._warned = True
            _log.warning(
                "lbs-claim is retired: lbs holds what a consumer reads by the consumer's lease, and "
                "recovery takes a dead consumer's streams as soon as its lease is gone, so reads no "
                "longer claim idle entries (that would take live work). Reading as without the plugin; "
                "uninstall it, or lbs.Config(disabled_plugins=('claim',)) to silence this."
            )
        return None


#: The instance the entry point registers.
plugin = ClaimReader()
