"""Dead-letter forwarding: from the dead-letter Redis stream to a backend a plugin provides.

The re-queue script writes dead letters to the service's dead-letter stream
atomically with taking them out of circulation; that stream is what makes
"nothing lost" true. A backend (hook ``lbs_dead_letter_backend``) forwards
them further: a JSON-lines file, another Redis, a database. The forwarder
deletes a dead letter from the stream only after the backend's ``write``
returned (confirmed); a write that raises leaves the batch in the stream,
and it is written again later. Delivery to the backend is therefore
at-least-once: a crash between a confirmed write and the delete writes that
batch again, so a backend that must not see duplicates keys on
:attr:`DeadLetter.id`.

Every client with a backend forwards, in the consumer group
``<service>-dlq-forwarders`` on the dead-letter stream (each letter goes to
one forwarder; a forwarder first retries its own unconfirmed letters, and
takes over those another forwarder left unconfirmed for
``Config.dead_letter_claim_idle`` seconds).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from redis.exceptions import ResponseError

from . import _keys
from ._connection import cancel_and_wait

if TYPE_CHECKING:
    from .client import Client

__all__ = ["DeadLetter", "DeadLetterBackend", "Forwarder"]


@dataclass(frozen=True)
class DeadLetter:
    """One entry of the dead-letter stream, as a backend receives it."""

    #: Its id in the dead-letter stream (unique per letter: a key for de-duplication).
    id: str
    #: Every field, decoded as UTF-8 (invalid bytes replaced).
    fields: Mapping[str, str] = field(default_factory=dict)
    #: The managed-field prefix (``Config.field_prefix``).
    prefix: str = "_"

    @property
    def reason(self) -> str:
        return self.fields.get(self.prefix + "reason", "")

    @property
    def consumer(self) -> str:
        return self.fields.get(self.prefix + "consumer", "")

    @property
    def failed_id(self) -> str:
        """The LBS entry that failed."""
        return self.fields.get(self.prefix + "failed_id", "")

    @property
    def retry_count(self) -> int:
        try:
            return int(self.fields.get(self.prefix + "retry_count", "0"))
        except ValueError:
            return 0

    @property
    def lbs_input(self) -> str:
        """The assignment's ``lbs-input`` JSON, as it was (possibly malformed)."""
        return self.fields.get(_keys.INPUT_FIELD, "")

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "reason", "consumer", "failed_id", "retry_count", "fields"}``: JSON-ready."""
        return {"id": self.id, "reason": self.reason, "consumer": self.consumer, "failed_id": self.failed_id,
                "retry_count": self.retry_count, "fields": dict(self.fields)}


@runtime_checkable
class DeadLetterBackend(Protocol):
    """Where dead letters go after the dead-letter stream (hook ``lbs_dead_letter_backend``)."""

    #: Shown in logs and metric labels.
    name: str

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Write ``letters`` durably; return only once they are. Raise if not written."""


def _decode(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class Forwarder:
    """The forwarding task of one client (started only when a plugin provides a backend)."""

    def __init__(self, client: Client, backend: DeadLetterBackend) -> None:
        self.client = client
        self.backend = backend
        self.key = client.dead_letter_key
        self.group = _keys.dead_letter_group(client.service)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name=f"lbs-dlq-forward-{self.client.id}")

    async def stop(self) -> None:
        if self.task is not None:
            await cancel_and_wait([self.task])
            self.task = None

    async def _ensure_group(self) -> None:
        try:
            await self.client._redis.xgroup_create(self.key, self.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def forward_once(self, start: str = ">", block_ms: int | None = None) -> int:
        """Read one batch (``start``: ">" new letters, "0" our unconfirmed ones), write it, delete it.

        Returns how many letters were forwarded; raises if the backend or Redis failed
        (the batch then stays in the stream, pending to this forwarder).
        """
        c = self.client
        cfg = c.config
        reply = await c._redis.xreadgroup(self.group, c.id, {self.key: start}, count=cfg.dead_letter_batch,
                                          block=block_ms)
        entries = _entries(reply)
        return await self._forward(entries)

    async def take_over(self) -> int:
        """Forward letters another forwarder left unconfirmed for ``dead_letter_claim_idle``."""
        c = self.client
        idle_ms = int(c.config.dead_letter_claim_idle * 1000)
        reply = await c._redis.xautoclaim(self.key, self.group, c.id, idle_ms, "0-0",
                                          count=c.config.dead_letter_batch)
        return await self._forward([e for e in reply[1] if e and e[1] is not None])

    async def _forward(self, entries: list[Any]) -> int:
        if not entries:
            return 0
        c = self.client
        prefix = c.config.field_prefix
        letters = [DeadLetter(_decode(eid), _fields(fields), prefix) for eid, fields in entries]
        try:
            await self.backend.write(letters)
        except Exception:
            c.recovery._metric("dead_letters_forward_failures_total", "counter", 1, backend=self.backend.name)
            raise
        ids = [letter.id for letter in letters]
        if c._use_xackdel:
            await c._redis.execute_command(  # type: ignore[no-untyped-call]
                "XACKDEL", self.key, self.group, "IDS", len(ids), *ids)
        else:
            pipe = c._redis.pipeline(transaction=True)
            pipe.xack(self.key, self.group, *ids)
            pipe.xdel(self.key, *ids)
            await pipe.execute()
        c.recovery._metric("dead_letters_forwarded_total", "counter", len(ids), backend=self.backend.name)
        return len(ids)

    async def _loop(self) -> None:
        c = self.client
        cfg = c.config
        block_ms = max(1, int(cfg.read_block * 1000))
        delay = cfg.read_retry_initial
        start = "0"  # our own unconfirmed letters first (a restart under the same id)
        loop = asyncio.get_running_loop()
        next_take_over = loop.time()
        while True:
            try:
                if start == "0":
                    await self._ensure_group()
                if loop.time() >= next_take_over:
                    await self.take_over()
                    next_take_over = loop.time() + cfg.dead_letter_claim_idle / 2
                n = await self.forward_once(start, None if start == "0" else block_ms)
                if start == "0" and n == 0:
                    start = ">"
                delay = cfg.read_retry_initial
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis, I/O, or the backend: retried, never fatal
                c.log.warning("dead-letter forwarding to %s failed (%s); the letters stay in %s and are "
                              "retried in %.1fs", self.backend.name, exc, self.key, delay)
                start = "0"
                await asyncio.sleep(random.uniform(delay / 2, delay))
                delay = min(delay * 2, cfg.read_retry_max)


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


def _fields(raw: Any) -> dict[str, str]:
    if isinstance(raw, dict):
        return {_decode(k): _decode(v) for k, v in raw.items()}
    return {_decode(raw[i]): _decode(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
