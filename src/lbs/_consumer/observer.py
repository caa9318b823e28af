"""The observer: the service's queue lengths as gauges, sampled every ``Config.metrics_interval``.

One round trip per sample, a pipeline of ``XINFO GROUPS`` on the LBS and
``XLEN`` of the LBS and of the dead-letter stream, recorded as the gauges
``backlog_depth`` (not yet delivered to the group), ``pel_depth``
(delivered, not finished) and ``dead_letter_depth`` (see
:mod:`lbs.metrics`). The values are the service's, not this client's:
every client of the service reports the same.

The backlog is the group's ``lag``. Redis leaves it nil when it cannot
count it (deleted entries after the group's last-delivered id; lbs deletes
every finished entry) and older servers do not report it; then it is
``XLEN - pending``, exact for an LBS, whose delivered entries stay in the
stream only while they are pending. A failed sample is logged at debug and
tried again at the next interval: gauges are never worth stopping for; one the
ACL denies is logged once at WARNING, with the rule that would allow it.

An idle client's share of Redis: one round trip of three plain reads every
``metrics_interval`` (5 s; a few microseconds of Redis each). No guarantee
rests on the gauges, so nothing asks for more; ``0`` turns them off.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from redis.crc import key_slot

from .._redis.connection import execute
from .._redis.errors import NoSuchKeyError
from .._redis.wire import text
from .._waits import wait_set
from .activity import Activity
from .state import ClientState

__all__ = ["Observer"]


class Observer(Activity, kind="observer"):
    """The sampling task of one client (none when ``Config.metrics_interval`` is 0)."""

    def __init__(self, state: ClientState) -> None:
        self.state = state
        n = state.names
        # On a cluster the link talks to the LBS's slot owner only: a dead-letter
        # stream named into another slot (Config.dead_letter_stream) is not sampled there.
        self._dlq_elsewhere = bool(n.dead_letter_key) and (
            key_slot(n.dead_letter_key.encode()) != key_slot(n.stream_key.encode())
        )

    def start(self) -> None:
        if self.state.config.metrics_interval > 0:
            super().start()

    async def _main(self) -> None:
        s = self.state
        every = s.config.metrics_interval
        while not s.stopping.is_set():
            await self.sample()
            await wait_set(s.stopping, every)

    async def sample(self) -> bool:
        """Read the three lengths in one round trip and record them; False (logged) when it failed."""
        s = self.state
        n = s.names
        link = s.link
        dlq = "" if self._dlq_elsewhere and link.node else n.dead_letter_key
        try:
            pipe = link.redis.pipeline(transaction=False)
            pipe.xinfo_groups(n.stream_key)
            pipe.xlen(n.stream_key)
            if dlq:
                pipe.xlen(dlq)
            replies = await execute(pipe, raise_on_error=False)
            for reply in replies[1:]:
                if isinstance(reply, Exception):
                    raise reply
            groups = replies[0]
            if isinstance(groups, NoSuchKeyError):
                groups = []  # no LBS yet: nothing delivered, nothing waiting
            elif isinstance(groups, Exception):
                raise groups
            length = int(replies[1])
            group = _group(groups, n.group)
            pending = 0 if group is None else int(group.get("pending") or 0)
            lag = None if group is None else group.get("lag")
            backlog = int(lag) if lag is not None else max(0, length - pending)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not s.denied(
                exc, "sampling the queue lengths (backlog, pending, dead-letter gauges)"
            ):
                s.log.debug(
                    "sampling the queue lengths failed (%s: %s); trying again in %.1fs",
                    type(exc).__name__,
                    exc,
                    s.config.metrics_interval,
                )
            return False
        hooks = s.hooks
        hooks.metric("backlog_depth", backlog)
        hooks.metric("pel_depth", pending)
        if dlq:
            hooks.metric("dead_letter_depth", int(replies[2]))
        return True


def _group(groups: Any, name: str) -> Mapping[str, Any] | None:
    """Our group's entry of an XINFO GROUPS reply (keys as text, in either RESP version), or None."""
    for info in groups or ():
        entry = {text(k): v for k, v in info.items()}
        if text(entry.get("name", b"")) == name:
            return entry
    return None
