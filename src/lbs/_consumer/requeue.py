"""Every call of ``requeue-6.lua`` and what its outcomes mean: re-queue, park, hand back, dead-letter.

Three kinds of caller, one script, each with its holder mode:

* **hand back** (``owned``): a held stream goes back, pending to us under our
  lease (``Client.hand_back``, a failed ``run()`` handler, shutdown, and the
  heartbeat for what it held when its lease lapsed): at once, or parked for
  a retry delay (:mod:`lbs._consumer.delays` brings it back);
* **recover** (``absent``): recovery re-queues an entry whose holder's lease
  is gone (deadline poller, keyspace listener, scan, startup, ``claim``),
  always at once;
* **dead-letter** (``owned``, then ``any``): a malformed entry goes to the
  dead-letter stream. What cannot
  be written yet (a dead-letter key of the wrong type, a lost connection)
  is kept and tried again on every heartbeat tick (:mod:`lbs._consumer.malformed`).

Every batch is one round trip on the link's pool wire.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from redis.exceptions import RedisError

from _lbscore import CommandBatch, Held

from .. import _keys
from .._redis import scripts
from .._redis.connection import execute
from .._redis.errors import WrongTypeError
from .._redis.scripts import NO_DELAY, RequeueCode, Requeued, RetryDelay
from .._redis.wire import UNENCODABLE, first_error, sendable, unencodable
from ..exceptions import RedisOperationError
from ..notifications import Notification, NotificationType
from .delays import Delays
from .malformed import Malformed
from .state import ClientState

__all__ = ["Requeue"]

#: How long, and how many, pardons are kept (``{<service>-input}:pardons``).
PARDON_KEEP_MS = 86_400_000
PARDON_KEEP = 100_000

#: One entry to send: (entry id, the reason kept in a dead letter).
_Call = tuple[str, str]

#: The detail of an entry set aside because the core could not encode it (its code is ``REFUSED``).
NOT_SENT = "not sent: "

#: The jitter of a fixed delay: none.
_NO_JITTER = partial(float, 1.0)

#: Entries per ``requeue-6.lua`` call: a dead holder's 100,000 streams are 1,000 calls, each short.
PER_CALL = 100


#: Beside a Go fleet: a dead holder's entry idle less than this (ms; or the lease TTL, when shorter) was just
#: claimed by a Go consumer (Claim moves it, then locks it): left alone (a dead Go holder's idled >= 2 s).
GO_CLAIM_WINDOW_MS = 1000


class Requeue:
    """The one caller of ``requeue-6.lua`` for one client."""

    def __init__(self, state: ClientState) -> None:
        self.state = state
        #: What brings parked copies back (its task runs while the client is started).
        self.delays = Delays(state)
        #: Entries we were delivered that go straight to the dead letters (malformed, out of retries).
        self.malformed = Malformed(state, self)
        #: Entry ids whose counted death was no one's fault (see :meth:`lost_while_alive`).
        self.pardons_key = _keys.pardons_key(state.names.service)
        #: Entry ids of hand-backs not answered yet (no longer held: a re-read leaves them alone).
        self.handing_back: set[str] = set()
        n, cfg = state.names, state.config
        go_sep = _keys.GO_MUTEX_KEY_SEP if cfg.go_compatible else ""
        #: The script's per-client switches, packed once.
        self.options = scripts.requeue_options(
            group=n.group,
            max_retries=cfg.max_retries,
            retry_field=n.retry_field,
            original_field=n.original_field,
            consumer=n.id,
            dead_letter_on=bool(n.dead_letter_key),
            field_prefix=n.field_prefix,
            go_lock_sep=go_sep,
            queued_prefix=n.queued_prefix,
            key_prefix=n.key_prefix,
            min_idle_ms=min(cfg.lock_ttl_ms, GO_CLAIM_WINDOW_MS) if go_sep else 0,
        )

    def _delay(self, delay: float | None) -> tuple[RetryDelay, Callable[[], float]]:
        """How long a copy is parked: ``delay`` None is the configured back-off (``Config.retry_delay``,
        doubling per retry up to ``retry_delay_max``), each entry's jittered in [d/2, d] (the draw);
        a number is that many seconds (0: at once)."""
        if delay is None:
            cfg = self.state.config
            first, most = round(cfg.retry_delay * 1000), round(cfg.retry_delay_max * 1000)
            if first > 0:
                return RetryDelay(first, most), partial(random.uniform, 0.5, 1.0)
            return NO_DELAY, _NO_JITTER
        fixed = round(delay * 1000)
        return (RetryDelay(fixed, fixed) if fixed > 0 else NO_DELAY), _NO_JITTER

    async def send(
        self,
        calls: Sequence[_Call],
        *,
        mode: str,
        count_retry: bool,
        force_dead_letter: bool = False,
        delay: float | None = 0.0,
        names: Sequence[str] = (),
        traceback: str = "",
        fields: Sequence[Sequence[str]] = (),
    ) -> list[Requeued | Exception]:
        """``requeue-6.lua`` for every entry of ``calls`` (``PER_CALL`` a call, one round trip); one reply
        (or server error) per entry. ``mode``: the holder mode (``owned``, ``restart``, ``any``: under
        our lease; ``absent``). ``names``: mode "owned", each entry's DataStreamName
        (``Config.go_compatible``: its Go-style lock is released with ours). ``fields``: each entry's
        fields set on the copy (flat names and values).

        Reasons and the traceback are sent as :func:`lbs._redis.wire.sendable` text. An entry the core
        cannot encode (a value UTF-8 cannot encode) is set aside and fails alone: its reply is
        ``[REFUSED, "not sent: <why>"]`` (nothing touched: it stays pending to its holder) and the
        other entries are sent."""
        s = self.state
        n = s.names
        # Without a dead-letter stream the key is only a name in the same slot: nothing is written to it.
        dead_letters = n.dead_letter_key or _keys.dead_letter_stream(n.service)
        retry_delay, jitter = self._delay(delay)
        entries = [
            scripts.RequeueEntry(
                entry_id,
                sendable(reason),
                jitter(),
                names[i] if names else "",
                fields[i] if fields else (),
            )
            for i, (entry_id, reason) in enumerate(calls)
        ]
        trace = sendable(traceback)

        def call(b: CommandBatch, some: Sequence[scripts.RequeueEntry]) -> None:
            scripts.requeue(
                b,
                n.stream_key,
                dead_letters,
                n.lease_prefix,
                self.delays.parked_key,
                self.delays.due_key,
                self.pardons_key,
                options=self.options,
                mode=mode,
                value=s.lease.value if mode != "absent" else "",
                count_retry=count_retry,
                force_dead_letter=force_dead_letter,
                traceback=trace,
                delay=retry_delay,
                entries=some,
            )

        async def sent(some: list[int]) -> list[Requeued | Exception]:
            if not some:
                return []
            chunks = [some[i : i + PER_CALL] for i in range(0, len(some), PER_CALL)]

            def build(b: CommandBatch) -> None:
                for chunk in chunks:
                    call(b, [entries[i] for i in chunk])

            out: list[Requeued | Exception] = []
            for chunk, reply in zip(chunks, await s.link.pool.execute(build)):
                out += (
                    [reply] * len(chunk)
                    if isinstance(reply, Exception)
                    else scripts.requeue_replies(reply)
                )
            return out

        try:
            return await sent(list(range(len(calls))))
        except UNENCODABLE:
            # Nothing was sent. Each entry alone: those the core cannot encode are set aside.
            unsent = {
                i: NOT_SENT + why
                for i, why in unencodable(len(calls), lambda b, i: call(b, [entries[i]])).items()
            }
            if not unsent:
                raise
        s.log.error(
            "%d of %d re-queue calls cannot be sent to Redis, set aside (the first: entry %s, %s); "
            "the others are sent",
            len(unsent),
            len(calls),
            calls[min(unsent)][0],
            unsent[min(unsent)],
        )
        rest = [i for i in range(len(calls)) if i not in unsent]
        replies = iter(await sent(rest))
        return [
            Requeued(RequeueCode.REFUSED, unsent[i]) if i in unsent else next(replies)
            for i in range(len(calls))
        ]

    # ----------------------------------------------------------- hand back ---

    async def hand_back(
        self,
        items: list[Held],
        *,
        count_retry: bool,
        reason: str,
        delay: float | None = 0.0,
        traceback: str = "",
        force_dead_letter: bool = False,
    ) -> list[str]:
        """Give held streams back (holder mode ``owned``); per stream its new entry id, or "" (with
        ``force_dead_letter``, an operator's cancel: each goes to the dead letters, its letter's id).

        ``delay`` None parks each for the configured back-off (none when
        ``Config.retry_delay`` is 0), a number of seconds parks it that long,
        0 re-queues it at once; a parked stream's id is its id in the parking
        stream (a parking key of the wrong type: re-queued at once instead).
        "" means dead-lettered (out of retries), dropped, refused (a
        dead-letter key of the wrong type: it stays pending to us, and
        recovery retries it once our lease is gone) or already lost.
        ``traceback``: the failure's, kept in a dead letter (``_traceback``).
        Raises :class:`lbs.RedisOperationError`.
        """
        if not items:
            return []
        s = self.state
        calls = [(h.entry_id, reason) for h in items]
        ids = {h.entry_id for h in items} - self.handing_back
        self.handing_back |= ids
        try:
            results = first_error(
                await self.send(
                    calls,
                    mode="owned",
                    count_retry=count_retry,
                    force_dead_letter=force_dead_letter,
                    delay=delay,
                    names=[h.stream for h in items],
                    traceback=traceback,
                    fields=s.hooks.hand_back_fields(items, count_retry),
                )
            )
            if delay != 0:
                await self._unparked(calls, results, count_retry)
        except RedisError as exc:
            raise RedisOperationError("hand back", exc) from exc
        finally:
            self.handing_back -= ids
        out = []
        for h, res in zip(items, results):
            code, detail = res.code, res.detail
            if code in (RequeueCode.REQUEUED, RequeueCode.PARKED):
                s.stats.handed_back += 1
                if code == RequeueCode.PARKED:
                    s.stats.retries_delayed += 1
                    wait = res.delay_ms / 1000
                    s.log.debug(
                        "%s (entry %s) comes back in %.3fs (retry %d; parked as %s)",
                        h.stream,
                        h.entry_id,
                        wait,
                        res.retries,
                        detail,
                    )
                    self.delays.soon(wait)
                s.hooks.notify(
                    "lbs_stream_handed_back",
                    stream=h.stream,
                    entry_id=h.entry_id,
                    new_entry_id=detail,
                    retry_counted=count_retry,
                )
                out.append(detail)
                continue
            if code in (RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED):
                why = "dead-lettered" if force_dead_letter else "is out of retries: dead-lettered"
                s.log.on(h).warning("%s (entry %s) %s (%s)", h.stream, h.entry_id, why, reason)
                self.dead_lettered(h.entry_id, reason, code, detail, h.stream)
                if force_dead_letter:
                    out.append(detail if code == RequeueCode.DEAD_LETTERED else "")
                    continue
            elif code == RequeueCode.REFUSED:
                s.log.on(h).error(
                    "could not hand back %s (entry %s): %s; it stays pending to this consumer, "
                    "recovered once its lease is gone",
                    h.stream,
                    h.entry_id,
                    detail.removeprefix("LBSKEY "),
                )
            else:
                s.log.on(h).warning(
                    "could not hand back %s (entry %s): %s", h.stream, h.entry_id, detail
                )
            out.append("")
        return out

    async def _unparked(
        self, calls: list[_Call], results: list[Requeued], count_retry: bool
    ) -> None:
        """Re-queue at once (in ``results``' place) what could not be parked: a parking key of the wrong
        type refuses the park with nothing written; a delay is not worth leaving the stream pending for."""
        keys = (f"LBSKEY {self.delays.parked_key} ", f"LBSKEY {self.delays.due_key} ")
        refused = [
            i
            for i, res in enumerate(results)
            if res.code == RequeueCode.REFUSED and res.detail.startswith(keys)
        ]
        if not refused:
            return
        s = self.state
        s.hooks.metric("wrong_type_keys_total", 1)
        s.log.error(
            "cannot park %d failed streams for their retry delay: %s; re-queued at once instead",
            len(refused),
            results[refused[0]].detail.removeprefix("LBSKEY "),
        )
        again = first_error(
            await self.send([calls[i] for i in refused], mode="owned", count_retry=count_retry)
        )
        for i, res in zip(refused, again):
            results[i] = res

    # ------------------------------------------------------------- recover ---

    async def recover(
        self,
        entry_ids: Iterable[str],
        path: str,
        reason: str,
        *,
        count_retry: bool = True,
        mode: str = "absent",
    ) -> int:
        """Re-queue every entry whose holder's lease is gone (mode ``absent``; ``restart``: an earlier
        process's under our consumer id); how many went back to the LBS. ``path`` labels the metrics
        (``keyspace``, ``deadline``, ``scan``, ``startup``, ``claim``). ``entry_ids`` may map each id to
        its holder and deadline (``journal.Holders``). Raises the Redis error of a failed batch."""
        codes = await self._recover(list(entry_ids), path, reason, count_retry, entry_ids, mode)
        return sum(1 for code in codes if code == RequeueCode.REQUEUED)

    async def lost_while_alive(self, entry_ids: list[str], reason: str, mode: str = "owned") -> int:
        """Streams this living client lost (its lease lapsed: a stall, an eviction, a partition): re-queue
        those still pending to it with no retry counted (``mode`` "owned": under its lease; "absent":
        while the lease is gone, before it is taken again), and pardon the rest: another consumer's
        recovery took them and may have counted a death, which ``requeue-6.lua`` takes back when the
        copy next goes back. How many went back to the LBS."""
        codes = await self._recover(entry_ids, "heartbeat", reason, False, mode=mode)
        taken = [i for i, code in zip(entry_ids, codes) if code != RequeueCode.REQUEUED]
        if taken:
            await self.pardon(taken)
        return sum(1 for code in codes if code == RequeueCode.REQUEUED)

    async def pardon(self, entry_ids: list[str]) -> None:
        """Record that these entries' holder lived (``{<service>-input}:pardons``), trimmed to a day and
        100,000 members. A key of another type is reported and left alone."""
        s = self.state
        key = self.pardons_key
        try:
            now = int(time.time() * 1000)
            pipe = s.link.redis.pipeline(transaction=True)
            pipe.zadd(key, dict.fromkeys(entry_ids, now))
            pipe.zremrangebyscore(key, "-inf", now - PARDON_KEEP_MS)
            pipe.zremrangebyrank(key, 0, -PARDON_KEEP - 1)
            await execute(pipe)
        except WrongTypeError:
            s.hooks.metric("wrong_type_keys_total", 1)
            s.log.error(
                "cannot pardon %d streams lost while this consumer lived: %s holds a value of the wrong "
                "type; the retries counted for them stand",
                len(entry_ids),
                key,
            )
            return
        s.hooks.metric("pardoned_total", len(entry_ids))
        s.log.info(
            "pardoned %d streams taken over while this consumer was cut off: their counted deaths are "
            "taken back",
            len(entry_ids),
        )

    async def claim(self, entry_id: str, mode: str = "absent", reason: str = "") -> bool:
        """Recover one assignment if its holder's lease is gone (``Client.claim``; mode "any": whatever its
        holder): whether this call took it out of its holder's hands (re-queued, or dead-lettered)."""
        why = reason or f"claimed by {self.state.names.id}"
        (code,) = await self._recover([entry_id], "claim", why, True, mode=mode)
        return code in (RequeueCode.REQUEUED, RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED)

    async def _recover(
        self,
        ids: list[str],
        path: str,
        reason: str,
        count_retry: bool,
        who: object = None,
        mode: str = "absent",
    ) -> list[int]:
        if not ids:
            return []
        s = self.state
        results = first_error(
            await self.send([(i, reason) for i in ids], mode=mode, count_retry=count_retry)
        )
        codes = []
        requeued = 0
        for entry_id, res in zip(ids, results):
            code, detail = res.code, res.detail
            codes.append(code)
            if code == RequeueCode.REQUEUED:
                requeued += 1
                self._announce(entry_id, res, path, who)
            elif code in (RequeueCode.DEAD_LETTERED, RequeueCode.DROPPED):
                s.hooks.metric("recovery_dlq_total", 1, path=path)
                s.log.warning(
                    "entry %s out of retries after %s recovery: dead-lettered", entry_id, path
                )
                self.dead_lettered(entry_id, reason, code, detail, res.stream)
            elif code == RequeueCode.REFUSED:
                if not detail.startswith(NOT_SENT):
                    s.hooks.metric("wrong_type_keys_total", 1)
                s.log.error(
                    "cannot re-queue entry %s (%s recovery): %s; it stays pending and is retried",
                    entry_id,
                    path,
                    detail.removeprefix("LBSKEY "),
                )
            elif code == RequeueCode.TRIMMED:
                s.hooks.metric("recovery_trimmed_total", 1, path=path)
                s.log.warning(
                    "entry %s was trimmed from the stream before recovery; its pending "
                    "reference was cleaned",
                    entry_id,
                )
            elif detail == "acked":
                s.hooks.metric("recovery_duplicate_ack_total", 1, path=path)
            elif detail == "go lock":
                s.log.debug(
                    "entry %s is held by a Go consumer (its Go lock exists): left to it", entry_id
                )
            elif detail == "claimed":
                s.log.debug(
                    "entry %s was just claimed (a Go consumer's Claim): left to it", entry_id
                )
        if requeued:
            # One line and one metric call per batch: a dead holder of 100,000 streams is 200 batches.
            s.hooks.metric(f"recovery_{path}_requeued_total", requeued)
            s.log.info(
                "recovered %d of %d streams (%s recovery: %s)", requeued, len(ids), path, reason
            )
        return codes

    def _announce(self, entry_id: str, res: Requeued, path: str, who: object) -> None:
        """STREAM_EXPIRED, informational: a stream came back into circulation."""
        stream, retry_count, new_id = res.stream, res.retries, res.detail
        s = self.state
        s.journal.recovered(stream, entry_id, new_id, retry_count, path, who)
        s.log.debug(
            "recovered %s (entry %s -> %s, retry %d)", stream, entry_id, new_id, retry_count
        )
        s.hooks.notify(
            "lbs_stream_expired",
            stream=stream,
            entry_id=entry_id,
            new_entry_id=new_id,
            retry_count=retry_count,
            path=path,
        )
        s.mailbox.put_nowait(
            Notification(
                NotificationType.STREAM_EXPIRED,
                stream,
                entry_id,
                {},
                retry_count,
                0,
                f"holder's lease expired; re-queued as {new_id}",
            )
        )

    def dead_lettered(self, entry_id: str, reason: str, code: int, detail: str, name: Any) -> None:
        """Tell the stats, the hooks and the journal that an entry went to the dead letters (or was dropped)."""
        letter = detail if code == RequeueCode.DEAD_LETTERED else ""
        self.state.stats.dead_lettered += 1
        self.state.hooks.notify(
            "lbs_stream_dead_lettered", entry_id=entry_id, reason=reason, dead_letter_id=letter
        )
        self.state.journal.dead_lettered(name, entry_id, reason, letter)
