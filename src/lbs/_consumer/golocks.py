"""Beside a Go reference client v0.4 fleet (``Config.go_compatible``): whether its consumers hold entries.

A Go consumer holds an entry by its Go-style lock ``<DataStreamName><MUTEX_KEY_SEP><entry id>`` (a
string key outside the service's slot); recovery's scan re-queues a dead holder's entry only when no
such lock exists either (:func:`go_unlocked`).
"""

from __future__ import annotations

from _lbscore import try_decode_input

from .. import _keys
from .._redis.connection import execute
from .._waits import wait_set
from ..config import GO_DONE_GAP
from .state import ClientState

__all__ = ["go_unlocked"]


async def go_unlocked(state: ClientState, entry_ids: list[str]) -> list[str]:
    """Those of ``entry_ids`` (pending, our lock gone) with no Go-style lock either, returned
    ``GO_DONE_GAP`` after this look (two round trips: the entries' names, their locks). Go's
    ``DoneStream`` deletes its lock, then XACKs in a second round trip: one that deleted it before the
    look has acked by the re-queue, one after it is seen alive. Empty when the client stops during the
    gap (another recoverer's scan takes them)."""
    pipe = state.link.redis.pipeline(transaction=False)
    for entry_id in entry_ids:
        pipe.xrange(state.names.stream_key, entry_id, entry_id, count=1)
    keys: dict[str, str] = {}  # entry id: its Go-style lock (none: gone, or no DataStreamName)
    for entry_id, found in zip(entry_ids, await execute(pipe)):
        fields = found[0][1] if found else {}  # (a client may decode replies: str keys)
        raw = fields.get(_keys.INPUT_FIELD.encode()) or fields.get(_keys.INPUT_FIELD)
        name = try_decode_input(raw)[0]
        if name is not None:
            keys[entry_id] = _keys.go_lock_key(name, entry_id)
    for key in keys.values():
        pipe.exists(key)
    held = {i for i, e in zip(keys, await execute(pipe) if keys else []) if e}
    unlocked = [i for i in entry_ids if i not in held]
    if unlocked and await wait_set(state.stopping, GO_DONE_GAP):
        return []
    return unlocked
