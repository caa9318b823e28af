"""Entries a consumer was delivered that go straight to the dead-letter stream: malformed ones (the core
judged them). One ``requeue-6.lua`` round trip
(through :class:`~lbs._consumer.requeue.Requeue`) dead-letters a batch; what could not be written (a
dead-letter key of the wrong type, a lost connection) stays pending to this live consumer, where no
recovery path looks, so the heartbeat tries it again every tick until it goes through."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from .._redis.scripts import RequeueCode

if TYPE_CHECKING:
    from _lbscore import Entry

    from .requeue import Requeue
    from .state import ClientState

__all__ = ["Malformed"]


class Malformed:
    """One client's dead-lettering of what it was delivered and cannot run."""

    def __init__(self, state: ClientState, requeue: Requeue) -> None:
        self.state, self.requeue = state, requeue
        #: Dead letters that could not be written yet: (entry, our held value, reason).
        self.undead: list[tuple[Entry, str, str]] = []

    async def dead_letter(self, bad: list[tuple[Entry, str, str]], *, again: bool = False) -> None:
        """Dead-letter entries we were delivered (malformed): one round trip.

        ``bad`` holds (entry, our held value, reason). The first try needs
        our lease (mode ``owned``). What could not be dead-lettered stays
        pending to this live consumer, where no recovery path looks, so
        :meth:`retry_undead` tries it again every heartbeat tick (``again``:
        mode ``any``; the entry is ours, pending to us, and the script acts
        only while it is pending) until it goes through.
        """
        s = self.state
        try:
            results = await self.requeue.send(
                [(e.id, reason) for e, _, reason in bad],
                mode="any" if again else "owned",
                count_retry=False,
                force_dead_letter=True,
            )
        except RedisError as exc:
            results = [exc] * len(bad)
        log = s.log.debug if again else s.log.error
        for item, res in zip(bad, results):
            e, _, reason = item
            if isinstance(res, Exception) or res.code == RequeueCode.REFUSED:
                why = str(res) if isinstance(res, Exception) else res.detail.removeprefix("LBSKEY ")
                log(
                    "entry %s: %s; cannot dead-letter it (%s): it stays pending and is tried again every "
                    "heartbeat",
                    e.id,
                    reason,
                    why,
                )
                self.undead.append(item)
                continue
            code, detail = res.code, res.detail
            s.log.warning(
                "entry %s: %s: %s",
                e.id,
                reason,
                "dead-lettered as " + detail
                if code == RequeueCode.DEAD_LETTERED
                else "dropped (no dead-letter stream)"
                if code == RequeueCode.DROPPED
                else f"left alone ({detail})",
            )
            if code in (RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED):
                self.requeue.dead_lettered(e.id, reason, code, detail, e.stream)

    async def retry_undead(self) -> None:
        """Try the dead letters that could not be written again (every heartbeat tick)."""
        if self.undead:
            retry, self.undead = self.undead, []
            await self.dead_letter(retry, again=True)
