"""Forwarding dead letters from the dead-letter stream to a plugin's backend (see lbs.deadletters).

A letter is deleted from the stream only after the backend's ``write``
returned; a write that raises leaves the batch pending to this forwarder,
which writes it again later (at-least-once). Forwarders share the consumer
group ``<service>-dlq-forwarders``: each letter goes to one of them, and one
takes over letters another left unconfirmed for
``Config.dead_letter_claim_idle`` seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .. import _keys
from .._redis.connection import ensure_group, execute
from .._redis.wire import fields_text, text
from ..deadletters import DeadLetter, DeadLetterBackend
from .activity import Activity
from .backoff import Backoff
from .state import ClientState

__all__ = ["Forwarder"]


class Forwarder(Activity, kind="dlq-forward"):
    """The forwarding task of one client (started only when a plugin provides a backend)."""

    def __init__(self, state: ClientState, backend: DeadLetterBackend) -> None:
        self.state = state
        self.backend = backend
        self.key = state.names.dead_letter_key
        self.group = _keys.dead_letter_group(state.names.service)

    async def forward_once(self, start: str = ">", block_ms: int | None = None) -> int:
        """Read one batch (``start``: ">" new letters, "0" our unconfirmed ones), write it, delete it.

        Returns how many letters were forwarded; raises if the backend or Redis failed
        (the batch then stays in the stream, pending to this forwarder).
        """
        s = self.state
        reply = await s.link.redis.xreadgroup(
            self.group,
            s.names.id,
            {self.key: start},
            count=s.config.dead_letter_batch,
            block=block_ms,
        )
        return await self._forward(_entries(reply))

    async def take_over(self) -> int:
        """Forward letters another forwarder left unconfirmed for ``dead_letter_claim_idle``."""
        s = self.state
        idle_ms = int(s.config.dead_letter_claim_idle * 1000)
        reply = await s.link.redis.xautoclaim(
            self.key, self.group, s.names.id, idle_ms, "0-0", count=s.config.dead_letter_batch
        )
        return await self._forward([e for e in reply[1] if e and e[1] is not None])

    async def _forward(self, entries: list[Any]) -> int:
        if not entries:
            return 0
        s = self.state
        prefix = s.config.field_prefix
        letters = [
            DeadLetter(text(eid, "replace"), fields_text(fields), prefix) for eid, fields in entries
        ]
        try:
            await self.backend.write(letters)
        except Exception:
            s.hooks.metric("dead_letters_forward_failures_total", 1, backend=self.backend.name)
            raise
        ids = [letter.id for letter in letters]
        r = s.link.redis
        if s.server.xackdel:
            await r.execute_command("XACKDEL", self.key, self.group, "IDS", len(ids), *ids)  # type: ignore[no-untyped-call]
        else:
            pipe = r.pipeline(transaction=True)
            pipe.xack(self.key, self.group, *ids)
            pipe.xdel(self.key, *ids)
            await execute(pipe)
        s.hooks.metric("dead_letters_forwarded_total", len(ids), backend=self.backend.name)
        return len(ids)

    async def _main(self) -> None:
        s = self.state
        cfg = s.config
        block_ms = max(1, int(cfg.read_block * 1000))
        backoff = Backoff(cfg.read_retry_initial, cfg.read_retry_max)
        start = "0"  # our own unconfirmed letters first (a restart under the same id)
        loop = asyncio.get_running_loop()
        next_take_over = loop.time()
        while True:
            try:
                if start == "0":
                    await ensure_group(s.link.redis, self.key, self.group)
                if loop.time() >= next_take_over:
                    await self.take_over()
                    next_take_over = loop.time() + cfg.dead_letter_claim_idle / 2
                n = await self.forward_once(start, None if start == "0" else block_ms)
                if start == "0" and n == 0:
                    start = ">"
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis, I/O, or the backend: retried, never fatal
                wait = backoff.next()
                s.log.warning(
                    "dead-letter forwarding to %s failed (%s); the letters stay in %s and are "
                    "retried in %.1fs",
                    self.backend.name,
                    exc,
                    self.key,
                    wait,
                )
                start = "0"
                await asyncio.sleep(wait)


def _entries(reply: Any) -> list[Any]:
    """The (id, fields) pairs of an XREADGROUP reply, RESP2 or RESP3; deleted entries skipped."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3: {stream: [entries]}
        batches = [v[0] for v in reply.values() if v]
    else:  # RESP2: [[stream, entries]]
        batches = [s[1] for s in reply]
    out: list[Any] = []
    for batch in batches:
        for entry in batch:
            if entry and entry[1] is not None:
                out.append(entry)
    return out
