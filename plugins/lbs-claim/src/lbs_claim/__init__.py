"""lbs plugin: the XREADGROUP ... CLAIM reader (Redis >= 8.4).

Every read also claims pending assignments idle for at least ``min_idle``:
the work of consumers that stopped comes back in the same round trip as
new work, with its delivery count, instead of waiting for the periodic
scan. ``read-3.lua`` locks a claimed entry like a new one, so a live holder
(its lock still set) keeps its stream, and earlier deliveries count as
failed attempts towards ``Config.max_retries`` (then: dead letter).

Why the threshold is safe: lbs's heartbeat refreshes the pending idle time
of every held entry at least every ``Config.pel_refresh_every`` ticks, so a
live lbs holder's entries never get near ``min_idle`` (the plugin refuses a
threshold that is not above that bound), and a holder that keeps its lock
but not the idle time (a Go client) still keeps its stream, because the
lock is checked.

Why the scan can run less often (``reconciliation_interval``, default
600 s instead of 60 s): whenever any consumer reads, every pending entry
idle past ``min_idle`` is claimed by that read; the scan is left for what
no read reaches (every consumer at capacity for a long time) and stays on
as the backstop, beside the deadline poller and the keyspace listener.

Installed, it is enabled for every client (entry point ``claim``); turn it
off with ``lbs.Config(disabled_plugins=("claim",))``. Settings, in order:
the constructor's arguments, then ``LBS_CLAIM_MIN_IDLE`` and
``LBS_CLAIM_SCAN_INTERVAL`` (seconds), then the defaults
(``Config.scan_min_idle``; 600 s).
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
    """Answers ``lbs_reader`` with a CLAIM strategy; on a server without CLAIM (Redis < 8.4, Valkey) it steps
    aside (one warning)."""

    def __init__(
        self, min_idle: float | None = None, reconciliation_interval: float | None = None
    ) -> None:
        self.min_idle = min_idle
        self.reconciliation_interval = reconciliation_interval
        self._warned = False  # the one warning on a server without CLAIM

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
        if server_version < MIN_SERVER:
            # Installing an extra must never break a server lbs supports: step aside, say so once.
            if not self._warned:
                self._warned = True
                shown = client.server_name or ".".join(map(str, server_version)) or "unknown"
                _log.warning(
                    "lbs-claim needs Redis >= 8.4 (XREADGROUP ... CLAIM); this server is %s: reading "
                    "without CLAIM (the scan and the deadline poller recover, as without the plugin). "
                    "Disable it with lbs.Config(disabled_plugins=('claim',)) to silence this.",
                    shown,
                )
            return None
        return self.strategy(client.config)


#: The instance the entry point registers.
plugin = ClaimReader()
