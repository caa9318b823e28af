"""The consumer's lease: one live process per consumer id, and what holds its entries.

An entry pending to a consumer in the group is held exactly while that
consumer's lease ``{<service>-input}:lease:<id>`` lives: it holds the running
process's instance nonce for ``Config.lock_ttl``, every heartbeat tick extends
it (``extend-n.lua``: one key however many streams are held), and recovery
takes a consumer's entries only once its lease is gone. A second live process
with the same id is refused at start; ``leave-3.lua`` deletes the lease on
close when nothing is pending any more, with the consumer itself (so the group
does not grow with every pod name); departed consumers are swept after
``Config.forget_consumers_after``. The sweep rides on the recovery scan.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import RedisError, ResponseError

from _lbscore import CommandBatch

from .._redis import scripts
from .._redis.connection import execute
from .._redis.errors import WrongTypeError
from .._redis.wire import text
from ..exceptions import ConfigurationError, RedisOperationError
from .state import ClientState

__all__ = ["Instance"]


class Instance:
    """This process's lease on its consumer id and its place in the group; the one caller of ``leave-3.lua``."""

    def __init__(self, state: ClientState) -> None:
        self.state = state

    async def take(self) -> None:
        """Take the lease, or refuse a second live process with the same id (:class:`lbs.ConfigurationError`).

        When the lease is taken, either its process died moments ago (the
        lease then expires within the TTL and this start goes on) or it is
        alive (the lease is extended, and this start is refused).
        """
        s = self.state
        r, key, cfg, me = s.link.redis, s.names.lease_key, s.config, s.names.id
        loop = asyncio.get_running_loop()
        give_up = loop.time() + cfg.lock_ttl + cfg.heartbeat_every + 1.0
        seen: tuple[Any, int] | None = None
        try:
            while not await r.set(key, s.lease.value, nx=True, px=cfg.lock_ttl_ms):
                pipe = r.pipeline(transaction=True)
                pipe.get(key)
                pipe.pttl(key)
                holder, pttl = await execute(pipe)
                if holder is None:
                    continue  # expired between the two calls
                if seen is None:
                    s.log.warning(
                        "consumer id %s is leased to instance %s (%s); waiting up to %.1fs "
                        "for that process's lease to expire",
                        me,
                        text(holder),
                        key,
                        pttl / 1000,
                    )
                elif holder != seen[0] or pttl > seen[1]:
                    raise ConfigurationError(
                        f"consumer id {me!r} is in use by another live process (instance "
                        f"{text(holder)}, lease {key}): give each process its own consumer id "
                        "(POD_NAME or consumer_id=...)"
                    )
                if loop.time() > give_up:
                    raise ConfigurationError(
                        f"consumer id {me!r} stays leased to instance {text(holder)} ({key}, "
                        f"ttl {pttl} ms): another process runs with it, or the key was set by hand"
                    )
                seen = (holder, pttl)
                await asyncio.sleep(min(0.1, cfg.heartbeat_every / 4))
        except WrongTypeError as exc:
            raise RedisOperationError(
                "start",
                ResponseError(
                    f"{key} holds a value of the wrong type, not this consumer's lease: {exc}"
                ),
            ) from exc

    async def release(self) -> None:
        """Delete the lease if still ours and nothing is pending to this consumer, so a restart under this
        id need not wait for it, and this consumer from the group (a clean close)."""
        s = self.state
        n = s.names
        key = n.lease_key

        def build(b: CommandBatch) -> None:
            scripts.leave(
                b,
                key,
                n.stream_key,
                n.consumers_key,
                instance=s.lease.value,
                group=n.group,
                consumer=n.id,
                tokens_prefix=n.tokens_prefix,
            )

        try:
            (reply,) = await s.link.pool.execute(build)
            if isinstance(reply, Exception):
                raise reply
            if scripts.leave_reply(reply).consumers_deleted:
                s.log.debug("left the group %s (nothing pending)", n.group)
        except RedisError as exc:
            if not s.denied(exc, f"deleting the lease {key}"):
                s.log.debug("could not delete the lease %s (%s); it expires", key, exc)

    async def forget_departed(self) -> int:
        """Delete the group's consumers with nothing pending that have not read for
        ``Config.forget_consumers_after`` seconds (0: never); how many. A live consumer deleted so is
        created again by its next read."""
        s = self.state
        n = s.names
        grace = s.config.forget_consumers_after
        if grace <= 0:
            return 0

        def build(b: CommandBatch) -> None:
            scripts.leave(
                b,
                n.lease_key,
                n.stream_key,
                n.consumers_key,
                instance="",
                group=n.group,
                consumer="",
                grace_ms=int(grace * 1000),
                tokens_prefix=n.tokens_prefix,
            )

        (reply,) = await s.link.pool.execute(build)
        if isinstance(reply, Exception):
            raise reply
        gone = scripts.leave_reply(reply).consumers_deleted
        if gone:
            s.hooks.metric("consumers_forgotten_total", gone)
            s.log.info(
                "forgot %d departed consumers of %s (nothing pending, idle over %gs)",
                gone,
                n.group,
                grace,
            )
        return gone
