"""The instance marker: one live process per consumer id.

Lock values are ``<token>:<consumer id>:<instance>``, so a process adopts
only its own locks; two processes under one consumer id would still share a
pending list and a deadline. The marker ``{<service>-input}:instance:<id>``
holds the running process's nonce with the lock TTL, and every heartbeat
tick refreshes it (``extend-n.lua``); a second live process with the same id
is refused at start, and ``leave-3.lua`` deletes the marker on close, with the consumer
itself when it has nothing pending (so the group does not grow with every pod name); departed
consumers are swept after ``Config.forget_consumers_after``.

The marker costs Redis nothing periodic of its own: the heartbeat's last
``extend-n.lua`` call refreshes it (an idle client's one tick every
``heartbeat_every``), and the sweep rides on the recovery scan.
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
    """This process's claim on its consumer id and its place in the group; the one caller of ``leave-3.lua``."""

    def __init__(self, state: ClientState) -> None:
        self.state = state

    async def take(self) -> None:
        """Take the marker, or refuse a second live process with the same id (:class:`lbs.ConfigurationError`).

        When the marker is taken, either its process died moments ago (the
        marker then expires within the TTL and this start goes on) or it is
        alive (the marker is refreshed, and this start is refused).
        """
        s = self.state
        r, key, cfg, me = s.link.redis, s.names.instance_key, s.config, s.names.id
        loop = asyncio.get_running_loop()
        give_up = loop.time() + cfg.lock_ttl + cfg.heartbeat_every + 1.0
        seen: tuple[Any, int] | None = None
        try:
            while not await r.set(key, s.names.instance, nx=True, px=cfg.lock_ttl_ms):
                pipe = r.pipeline(transaction=True)
                pipe.get(key)
                pipe.pttl(key)
                holder, pttl = await execute(pipe)
                if holder is None:
                    continue  # expired between the two calls
                if seen is None:
                    s.log.warning(
                        "consumer id %s is marked in use by instance %s (%s); waiting up to %.1fs "
                        "for that process's marker to expire",
                        me,
                        text(holder),
                        key,
                        pttl / 1000,
                    )
                elif holder != seen[0] or pttl > seen[1]:
                    raise ConfigurationError(
                        f"consumer id {me!r} is in use by another live process (instance "
                        f"{text(holder)}, marker {key}): give each process its own consumer id "
                        "(POD_NAME or consumer_id=...)"
                    )
                if loop.time() > give_up:
                    raise ConfigurationError(
                        f"consumer id {me!r} stays marked in use by instance {text(holder)} ({key}, "
                        f"ttl {pttl} ms): another process runs with it, or the key was set by hand"
                    )
                seen = (holder, pttl)
                await asyncio.sleep(min(0.1, cfg.heartbeat_every / 4))
        except WrongTypeError as exc:
            raise RedisOperationError(
                "start",
                ResponseError(
                    f"{key} holds a value of the wrong type, not this consumer's instance marker: {exc}"
                ),
            ) from exc

    async def release(self) -> None:
        """Delete the marker if still ours, so a restart under this id need not wait for it, and this
        consumer from the group when it has nothing pending (a clean close)."""
        s = self.state
        n = s.names
        key = n.instance_key

        def build(b: CommandBatch) -> None:
            scripts.leave(
                b,
                key,
                n.stream_key,
                n.consumers_key,
                instance=n.instance,
                group=n.group,
                consumer=n.id,
            )

        try:
            (reply,) = await s.link.pool.execute(build)
            if isinstance(reply, Exception):
                raise reply
            if int(reply[1]):
                s.log.debug("left the group %s (nothing pending)", n.group)
        except RedisError as exc:
            if not s.denied(exc, f"deleting the instance marker {key}"):
                s.log.debug("could not delete the instance marker %s (%s); it expires", key, exc)

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
                n.instance_key,
                n.stream_key,
                n.consumers_key,
                instance="",
                group=n.group,
                consumer="",
                grace_ms=int(grace * 1000),
            )

        (reply,) = await s.link.pool.execute(build)
        if isinstance(reply, Exception):
            raise reply
        gone = int(reply[1])
        if gone:
            s.hooks.metric("consumers_forgotten_total", gone)
            s.log.info(
                "forgot %d departed consumers of %s (nothing pending, idle over %gs)",
                gone,
                n.group,
                grace,
            )
        return gone
