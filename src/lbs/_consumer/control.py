"""An operator's controls as one consumer obeys them: the service's pause, and orders about streams it holds.

The operator's side is :mod:`lbs.controls` (``lbs pause``, ``lbs release`` ..., the dashboard). Here,
once every :data:`CONTROL_POLL` while it holds work or the service is paused, every :data:`IDLE_LOOK`
otherwise (and once before the reader starts), one round trip of plain reads:
``HGETALL`` of the service's pause (:func:`lbs._keys.paused_key`) and of this consumer's orders
(:func:`lbs._keys.orders_key`).

- **Pause.** While the pause key exists the reader reads nothing new (it waits on :meth:`wait_resumed`);
  every take also checks the key in its ``MULTI`` (:mod:`lbs._consumer.take`), so a batch a read took
  after the pause went back with no retry counted, however late this look. Held streams run on and
  finish; recovery, retries coming due and the heartbeat go on as ever: what they put back waits in the
  LBS. A pause key of another type counts as a pause (the take sees it so) and is logged once.
- **Orders**, one per entry id, from an operator: ``release`` (hand the stream back now: its handler is
  cancelled, the stream goes back to the LBS with no retry counted), ``cancel`` (its handler is
  cancelled and the stream dead-lettered with the operator's reason), ``drop`` (an operator
  force-claimed it: it is in the LBS again already, so its handler is cancelled and it is forgotten).
  The stream is disowned first, as when the lease is lost: ``done_stream`` of it says LOCK_LOST, the
  notification API gets STREAM_DISOWNED, the handler's ``CancelledError`` hands nothing back. The
  outcome replaces the order (``"state": "done"``), for the operator's tool to read and delete (a
  ``drop``'s order is deleted: nobody waits for it); it is
  logged at WARNING (who asked, what became of the stream) and journaled (``released``,
  ``cancelled``, ``dropped``). A hand-back Redis refuses is tried again at the next look.

An idle consumer's share of Redis: two plain reads every five seconds (a second while it holds work).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

from .._redis.connection import execute
from .._redis.wire import text
from .._waits import wait_set
from ..exceptions import RedisOperationError
from .activity import Activity

if TYPE_CHECKING:
    from _lbscore import Held

    from .requeue import Requeue
    from .state import ClientState

__all__ = ["ACTIONS", "CONTROL_POLL", "IDLE_LOOK", "Controls"]

#: Seconds between two looks at the pause and the orders.
CONTROL_POLL = 1.0
#: ... while this consumer holds nothing and the service is not paused.
IDLE_LOOK = 5.0
#: What an operator may order a holder to do with a stream it holds.
ACTIONS = ("release", "cancel", "drop")
#: Each action as the log and the dead letter's reason say it.
DONE = {"release": "released", "cancel": "cancelled", "drop": "force-claimed"}


class Controls(Activity, kind="controls"):
    """The pause and the operators' orders, for one client."""

    def __init__(self, state: ClientState, requeue: Requeue) -> None:
        self.state, self.requeue = state, requeue
        #: The service is paused (as of the last look, or the last take that found it so).
        self.paused = False
        #: Who paused it and why, as the pause key says (empty when not paused).
        self.pause: dict[str, str] = {}
        #: Set at each change of :attr:`paused`.
        self.changed = asyncio.Event()
        #: Orders whose stream was disowned but whose hand-back failed: tried again at the next look.
        self._unfinished: dict[str, tuple[Held, dict[str, Any]]] = {}
        self._warned: set[str] = set()

    async def _main(self) -> None:
        s = self.state
        looked = time.monotonic()
        while not s.stopping.is_set():
            await wait_set(s.stopping, CONTROL_POLL)
            # Holding nothing, not paused, nothing left to finish: no order can concern it, and a
            # pause is caught by the take's MULTI anyway. Such an idle consumer looks less often.
            idle = not (self.paused or self._unfinished or len(s.holdings))
            if s.stopping.is_set() or (idle and time.monotonic() - looked < IDLE_LOOK):
                continue
            looked = time.monotonic()
            await self.look()

    async def wait_resumed(self) -> None:
        """Return once the service is no longer paused, or the client stops."""
        s = self.state
        while self.paused and not s.stopping.is_set():
            self.changed.clear()
            if not self.paused:
                break
            await wait_set(self.changed, CONTROL_POLL)
            if s.stopping.is_set():
                break

    def found_paused(self) -> None:
        """A take found the service paused (before this task's next look)."""
        self._set_paused(True, self.pause)

    async def look(self) -> None:
        """One look at the pause and the orders; a failure is logged (once per kind) and left to the next."""
        s = self.state
        n = s.names
        try:
            pipe = s.link.redis.pipeline(transaction=False)
            pipe.hgetall(n.paused_key)
            pipe.hgetall(n.orders_key)
            pause, orders = await execute(pipe, raise_on_error=False)
        except (RedisError, OSError) as exc:
            s.log.debug("looking at the pause and orders failed: %s", exc)
            return
        if isinstance(pause, ResponseError):
            self._warn_once(
                "pause",
                "%s holds a value of another type (%s): the service counts as paused until it is "
                "deleted (lbs resume)",
                n.paused_key,
                pause,
            )
            self._set_paused(True, {})
        elif not isinstance(pause, Exception):
            fields = {text(k, "replace"): text(v, "replace") for k, v in pause.items()}
            self._set_paused(bool(fields), fields)
        if isinstance(orders, ResponseError):
            self._warn_once("orders", "cannot read the orders in %s: %s", n.orders_key, orders)
            orders = {}
        if isinstance(orders, Exception):
            return
        for entry_id, (h, order) in list(self._unfinished.items()):
            await self._hand_back(entry_id, h, order)
        for raw_id, raw in orders.items():
            entry_id = text(raw_id, "replace")
            if entry_id not in self._unfinished:
                await self._obey(entry_id, raw)

    def _set_paused(self, paused: bool, pause: dict[str, str]) -> None:
        s = self.state
        if paused != self.paused:
            self.paused = paused
            self.changed.set()
            if paused:
                by = pause.get("by") or "?"
                why = f": {pause['reason']}" if pause.get("reason") else ""
                s.log.warning(
                    "the service is paused (by %s%s): taking nothing new; the %d streams held run on",
                    by,
                    why,
                    len(s.holdings),
                )
            else:
                s.log.warning("the service is resumed: taking new work again")
        self.pause = pause if paused else {}

    async def _obey(self, entry_id: str, raw: Any) -> None:
        s = self.state
        try:
            order = json.loads(raw)
            action = order["action"]
            if not isinstance(order, dict) or action not in ACTIONS:
                raise ValueError(action)
        except (ValueError, KeyError, TypeError):
            self._warn_once(
                "bad", "an order in %s is not one lbs wrote: %r", s.names.orders_key, raw
            )
            await self._answer(entry_id, {"action": "?"}, "refused", "not an order lbs wrote")
            return
        if order.get("state") == "done":
            return  # answered: the operator's tool reads and deletes it
        h = s.holdings.table.get(entry_id)
        if h is None:
            await self._answer(entry_id, order, "not held", f"{s.names.id} does not hold it")
            return
        s.holdings.drop(h)
        by, reason = order.get("by") or "an operator", order.get("reason") or ""
        said = f"{DONE[action]} by {by}"
        s.log.on(h).warning(
            "%s (entry %s, token %d) %s%s",
            h.stream,
            h.entry_id,
            h.token,
            said,
            f": {reason}" if reason else "",
        )
        s.let_go(h, said)
        if action == "drop":
            s.journal.record("dropped", stream=h.stream, entry_id=entry_id, token=h.token, by=by)
            try:  # nobody waits for the answer: the order goes
                await s.link.redis.hdel(s.names.orders_key, entry_id)
            except (RedisError, OSError) as exc:
                s.log.debug("deleting the order about entry %s failed: %s", entry_id, exc)
            return
        await self._hand_back(entry_id, h, order)

    async def _hand_back(self, entry_id: str, h: Held, order: dict[str, Any]) -> None:
        s = self.state
        action, by = order["action"], order.get("by") or "an operator"
        reason = f"{DONE[action]} by {by}" + (f": {order['reason']}" if order.get("reason") else "")
        cancel = action == "cancel"
        try:
            (got,) = await self.requeue.hand_back(
                [h], count_retry=False, reason=reason, delay=0, force_dead_letter=cancel
            )
        except RedisOperationError as exc:
            self._unfinished[entry_id] = (h, order)
            s.log.on(h).warning("%s of %s failed (%s); trying again", action, h.stream, exc)
            return
        self._unfinished.pop(entry_id, None)
        if not got:
            outcome, detail = "not acted", "Redis refused it (see the consumer's log)"
        elif cancel:
            outcome, detail = "cancelled", got
        else:
            outcome, detail = "released", got
        if outcome != "not acted":
            field = "dead_letter_id" if cancel else "new_entry_id"
            s.journal.record(
                outcome,
                stream=h.stream,
                entry_id=entry_id,
                token=h.token,
                by=by,
                reason=reason,
                **{field: got},
            )
        await self._answer(entry_id, order, outcome, detail)

    async def _answer(
        self, entry_id: str, order: dict[str, Any], outcome: str, detail: str
    ) -> None:
        """Replace the order with its outcome, for the operator's tool."""
        s = self.state
        answer = {
            **order,
            "state": "done",
            "outcome": outcome,
            "detail": detail,
            "consumer": s.names.id,
        }
        try:
            await s.link.redis.hset(s.names.orders_key, entry_id, json.dumps(answer))
        except (RedisError, OSError) as exc:
            s.log.warning("answering the order about entry %s failed: %s", entry_id, exc)

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            self.state.log.error(message, *args)
