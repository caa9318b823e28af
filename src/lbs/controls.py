"""An operator's hands on live work: pause and resume a service; release, cancel or force-claim a held stream.

``lbs pause``, ``lbs resume``, ``lbs release``, ``lbs cancel`` and ``lbs claim --force`` call this, as
does the dashboard (behind ``--actions``). Each action is written to the service's journal
(:mod:`lbs.events`: ``paused``, ``resumed``, ``force_claimed`` here; ``released``, ``cancelled``,
``dropped`` by the consumer that obeyed) and logged on ``lbs.controls`` at WARNING. The consumer's
side is :mod:`lbs._consumer.control`.

- **Pause** (``{<service>-input}:paused``, a hash: ``by``, ``reason``, ``since_ms``): consumers take
  nothing new. Every take checks the key in its ``MULTI`` (a batch a read took after the pause is
  put back with no retry counted), so nothing *starts* once :meth:`ServiceControls.pause` returned,
  and each consumer stops reading at its next look (once a second while it holds work, every five
  seconds while idle). Held streams run on and finish. Registrations wait in the LBS, as do the
  streams recovery brings back from dead consumers and retries coming due. ``run_keyed()`` is not
  paused. **Resume** deletes the key.
- **Release** (hand back) and **cancel** go to the holder (its orders hash,
  ``{<service>-input}:orders:<consumer>``), which acts within a second: it cancels the handler, then
  hands the stream back to the LBS with no retry counted (release) or dead-letters it with the
  operator's reason (cancel). The call waits for the holder's answer (``wait`` seconds).
- **Force-claim** re-queues a held stream now, whatever its holder (for a holder that is stuck but
  alive), one retry counted (dead-lettered past ``max_retries``), as ``requeue-6.lua`` does for a
  dead holder; the holder is told to drop it (its handler is cancelled when it next looks). Its
  handler may still run until then: the stream's next holder gets a larger fencing token.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from . import _keys
from ._admin import ServiceHandle, on_owner, time_ms
from ._redis.connection import RedisLike, execute
from ._redis.wire import text
from ._streamids import checked_ids
from .config import Config
from .exceptions import ConfigurationError, RedisOperationError
from .hookspecs import hookimpl

__all__ = ["ControlOutcome", "PauseState", "ServiceControls"]

log = logging.getLogger("lbs.controls")

#: How long an operator's order lives unanswered in Redis (ms): a holder that never looks (an older
#: lbs, a Go consumer) leaves nothing behind for long.
ORDER_TTL_MS = 3_600_000
#: Seconds between two looks for the holder's answer.
ANSWER_POLL = 0.05


@dataclass(frozen=True)
class PauseState:
    """A service's pause: who paused it, why, since when (server ms)."""

    by: str
    reason: str
    since_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"by": self.by, "reason": self.reason, "since_ms": self.since_ms}


@dataclass(frozen=True)
class ControlOutcome:
    """What an action on one held stream became."""

    entry_id: str
    #: ``released``, ``cancelled``, ``force-claimed``, ``dead-lettered`` (force-claimed past
    #: ``max_retries``), ``not held`` (not pending, or its holder does not hold it), ``no answer``
    #: (the holder did not act within the wait: an older lbs, or stuck), ``not acted`` (refused).
    outcome: str
    #: The consumer that held it ("" when none).
    holder: str
    #: The stream's new entry id, its dead letter's id, or why not.
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {
            "entry_id": self.entry_id,
            "outcome": self.outcome,
            "holder": self.holder,
            "detail": self.detail,
        }


def operator_name() -> str:
    """``user@host`` of this process: who an action is logged as when the caller says nothing."""
    try:
        user = getpass.getuser()  # $LOGNAME, $USER, ..., then the password database
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"


def _ids(entry_ids: str | Iterable[str]) -> list[str]:
    return checked_ids([entry_ids] if isinstance(entry_ids, str) else entry_ids, ConfigurationError)


def _who(by: str) -> str:
    if not isinstance(by, str) or not by.strip():
        raise ConfigurationError(f"by must name who acts (a non-empty string), got {by!r}")
    return by.strip()


class ServiceControls(ServiceHandle):
    """Pause, resume, release, cancel and force-claim in one service (see the module).

    ::

        async with ServiceControls("redis://...", "orders") as controls:
            await controls.pause(by="ana", reason="migrating the database")
            for o in await controls.release(["1700000000000-0"], by="ana"):
                print(o.entry_id, o.outcome, o.detail)
            await controls.resume(by="ana")

    ``redis`` is a redis.asyncio client (left open), a ``RedisCluster`` (or ``cluster=True``) or a
    URL (opened here, closed by :meth:`aclose`). ``config``: the service's (``max_retries`` for a
    force-claim, the journal's bound). Redis failures raise :class:`lbs.RedisOperationError`; bad
    arguments :class:`lbs.ConfigurationError`.
    """

    async def __aenter__(self) -> ServiceControls:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the Redis client if it was opened here (from a URL)."""
        if self._owned:
            await self._client.aclose()

    # -- pause ------------------------------------------------------------------------------

    async def pause(self, by: str, reason: str = "") -> PauseState:
        """Pause the service (again: the pause is replaced); the pause in force."""
        by = _who(by)
        key = _keys.paused_key(self.service)
        async with self._on("pause") as r:
            now = time_ms(await r.time())
            pipe = r.pipeline(transaction=True)
            pipe.delete(key)  # a key of another type is replaced, not an error
            pipe.hset(key, mapping={"by": by, "reason": reason, "since_ms": str(now)})
            self._journal(pipe, "paused", by, reason=reason)
            await execute(pipe)
        log.warning("%s: paused by %s%s", self.service, by, f" ({reason})" if reason else "")
        return PauseState(by, reason, now)

    async def resume(self, by: str) -> PauseState | None:
        """Resume the service; the pause it ended (None: it was not paused)."""
        by = _who(by)
        was = await self.paused()
        key = _keys.paused_key(self.service)
        async with self._on("resume") as r:
            pipe = r.pipeline(transaction=True)
            pipe.delete(key)
            self._journal(pipe, "resumed", by, reason="")
            await execute(pipe)
        log.warning("%s: resumed by %s%s", self.service, by, "" if was else " (it was not paused)")
        return was

    async def paused(self) -> PauseState | None:
        """The pause in force, or None."""
        key = _keys.paused_key(self.service)
        async with self._on("read the pause") as r:
            kind = text(await r.type(key), "replace")
            if kind == "none":
                return None
            if kind != "hash":  # consumers count it as a pause: say so
                return PauseState("?", f"{key} holds a {kind} (lbs resume deletes it)", 0)
            raw = await r.hgetall(key)
        fields = {text(k, "replace"): text(v, "replace") for k, v in raw.items()}
        since = fields.get("since_ms", "0")
        return PauseState(
            fields.get("by", "?"), fields.get("reason", ""), int(since) if since.isdigit() else 0
        )

    async def server_time_ms(self) -> int:
        """The server's clock (ms), which a pause's ``since_ms`` is measured by."""
        async with self._on("time") as r:
            return time_ms(await r.time())

    # -- held streams ---------------------------------------------------------------------------

    async def release(
        self, entry_ids: str | Iterable[str], by: str, reason: str = "", *, wait: float = 10.0
    ) -> list[ControlOutcome]:
        """Ask each stream's holder to hand it back now (its handler cancelled, no retry counted)."""
        return await self._order("release", _ids(entry_ids), _who(by), reason, wait)

    async def cancel(
        self, entry_ids: str | Iterable[str], by: str, reason: str = "", *, wait: float = 10.0
    ) -> list[ControlOutcome]:
        """Ask each stream's holder to cancel its handler and dead-letter it (``reason`` kept)."""
        return await self._order("cancel", _ids(entry_ids), _who(by), reason, wait)

    async def force_claim(
        self, entry_ids: str | Iterable[str], by: str, reason: str = ""
    ) -> list[ControlOutcome]:
        """Re-queue each held stream now, whatever its holder, one retry counted; tell the holder."""
        ids, by = _ids(entry_ids), _who(by)
        holders = await self.holders(ids)
        claimed = await _force(self._client, self.service, ids, self.config, by, reason)
        out = []
        async with self._on("force-claim") as r:
            pipe = r.pipeline(transaction=False)
            for entry_id in ids:
                holder = holders.get(entry_id, "")
                got = claimed.get(entry_id)
                if got is None:
                    out.append(ControlOutcome(entry_id, "not held", holder, "not pending"))
                    continue
                outcome, detail = got
                out.append(ControlOutcome(entry_id, outcome, holder, detail))
                self._journal(
                    pipe,
                    "force_claimed",
                    by,
                    reason=reason,
                    entry_id=entry_id,
                    holder=holder,
                    outcome=outcome,
                    detail=detail,
                )
                if holder:
                    self._send_order(pipe, holder, entry_id, "drop", by, reason)
                log.warning(
                    "%s: entry %s (held by %s) force-claimed by %s: %s %s",
                    self.service,
                    entry_id,
                    holder or "?",
                    by,
                    outcome,
                    detail,
                )
            if len(pipe):
                await execute(pipe)
        return out

    async def holders(self, entry_ids: list[str]) -> dict[str, str]:
        """Each pending entry id's consumer (XPENDING); ids not pending are left out."""
        group = _keys.group_name(self.service)
        async with self._on("read the pending list") as r:
            pipe = r.pipeline(transaction=False)
            for entry_id in entry_ids:
                pipe.xpending_range(self.stream, group, entry_id, entry_id, 1)
            replies = await execute(pipe, raise_on_error=False)
        out = {}
        for entry_id, p in zip(entry_ids, replies):
            if p and not isinstance(p, Exception):
                out[entry_id] = text(p[0]["consumer"], "replace")
        return out

    async def _order(
        self, action: str, ids: list[str], by: str, reason: str, wait: float
    ) -> list[ControlOutcome]:
        holders = await self.holders(ids)
        sent = holders
        async with self._on(action) as r:
            if sent:
                pipe = r.pipeline(transaction=False)
                for entry_id, holder in sent.items():
                    self._send_order(pipe, holder, entry_id, action, by, reason)
                await execute(pipe)
            answers = await self._answers(r, sent, wait)
            if sent:  # answered or given up: the orders go
                pipe = r.pipeline(transaction=False)
                for entry_id, holder in sent.items():
                    pipe.hdel(_keys.orders_key(self.service, holder), entry_id)
                await execute(pipe, raise_on_error=False)
        out = []
        for entry_id in ids:
            holder = holders.get(entry_id, "")
            answer = answers.get(entry_id)
            if not holder:
                out.append(ControlOutcome(entry_id, "not held", "", "not pending"))
            elif answer is None:
                detail = (
                    f"{holder} did not act within {wait:g}s (stuck, or an lbs without controls)"
                )
                out.append(ControlOutcome(entry_id, "no answer", holder, detail))
            else:
                out.append(
                    ControlOutcome(
                        entry_id,
                        str(answer.get("outcome", "not acted")),
                        holder,
                        str(answer.get("detail", "")),
                    )
                )
            o = out[-1]
            log.warning(
                "%s: %s of entry %s (held by %s) asked by %s: %s %s",
                self.service,
                action,
                entry_id,
                holder or "nobody",
                by,
                o.outcome,
                o.detail,
            )
        return out

    async def _answers(
        self, r: Any, sent: dict[str, str], wait: float
    ) -> dict[str, dict[str, Any]]:
        """The holders' answers to the orders ``sent``, polled until all came or ``wait`` passed."""
        answers: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + wait
        while True:
            left = [i for i in sent if i not in answers]
            if not left:
                return answers
            pipe = r.pipeline(transaction=False)
            for entry_id in left:
                pipe.hget(_keys.orders_key(self.service, sent[entry_id]), entry_id)
            for entry_id, raw in zip(left, await execute(pipe, raise_on_error=False)):
                if isinstance(raw, (bytes, str)):
                    try:
                        got = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(got, dict) and got.get("state") == "done":
                        answers[entry_id] = got
            if time.monotonic() >= deadline:
                return answers
            await asyncio.sleep(ANSWER_POLL)

    def _send_order(
        self, pipe: Any, holder: str, entry_id: str, action: str, by: str, reason: str
    ) -> None:
        key = _keys.orders_key(self.service, holder)
        order = {"action": action, "by": by, "reason": reason, "at": int(time.time() * 1000)}
        pipe.hset(key, entry_id, json.dumps(order))
        pipe.pexpire(key, ORDER_TTL_MS)

    def _journal(self, pipe: Any, kind: str, by: str, **fields: Any) -> None:
        values = {"kind": kind, "consumer": by, "by": by, **fields}
        pipe.xadd(
            _keys.events_stream(self.service),
            {k: str(v) for k, v in values.items()},
            maxlen=self.config.journal_maxlen,
            approximate=True,
        )

    @asynccontextmanager
    async def _on(self, doing: str) -> AsyncIterator[Any]:
        """A plain client of the service's master (on a cluster); a Redis failure as
        :class:`lbs.RedisOperationError` naming ``doing``."""
        try:
            async with on_owner(self._client, self.stream) as (r, _):
                yield r
        except (RedisError, OSError) as exc:
            raise RedisOperationError(doing, exc) from exc


class _Outcomes:
    """Hooks of the force-claim's short-lived client: what each claim became."""

    def __init__(self) -> None:
        self.got: dict[str, tuple[str, str]] = {}

    @hookimpl
    def lbs_stream_expired(self, entry_id: str, new_entry_id: str, retry_count: int) -> None:
        self.got[entry_id] = ("force-claimed", f"as {new_entry_id} (retry {retry_count})")

    @hookimpl
    def lbs_stream_dead_lettered(self, entry_id: str, dead_letter_id: str) -> None:
        self.got[entry_id] = ("dead-lettered", f"as {dead_letter_id} (past max_retries)")


async def _force(
    redis: RedisLike, service: str, ids: list[str], config: Config, by: str, reason: str
) -> dict[str, tuple[str, str]]:
    """``requeue-6.lua`` in mode "any" for each id, by a short-lived client that reads nothing."""
    from .client import Client  # the client imports the consumer's whole machinery: only here

    outcomes = _Outcomes()
    cfg = Config(
        recovery=False,
        configure_keyspace_events=False,
        max_retries=config.max_retries,
        retry_delay=0.0,
        journal=False,
        dead_letter_stream=config.dead_letter_stream,
        field_prefix=config.field_prefix,
    )
    client = Client(
        redis,
        service,
        consumer_id=f"lbs-operator-{socket.gethostname()}-{os.getpid()}",
        config=cfg,
        plugins=[outcomes],
        load_entrypoint_plugins=False,
    )
    why = f"force-claimed by {by}" + (f": {reason}" if reason else "")
    try:
        await client.reset_topology()
        for entry_id in ids:
            await client.claim(entry_id, force=True, reason=why)
    finally:
        await client.close()
    return outcomes.got
