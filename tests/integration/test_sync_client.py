"""The blocking facade, from plain threads."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

import lbs


def test_sync_client_takes_finishes_and_runs(redis_server: Any, service: str) -> None:
    r = redis.Redis.from_url(redis_server.url)
    for name in ("a", "b"):
        r.xadd(lbs.input_stream(service), {"lbs-input": lbs.encode_input(name)})
    cfg = lbs.Config(read_block=0.1)
    with lbs.SyncClient(redis_server.url, service, "sync", cfg, load_entrypoint_plugins=False) as c:
        notes = []
        for note in c.notifications(timeout=5):
            notes.append(note)
            if len(notes) == 2:
                break
        assert [n.stream for n in notes] == ["a", "b"]
        assert c.done_stream("a") is lbs.DoneStatus.DONE

    # run(): a plain function per stream, in worker threads, until close().
    r.xadd(lbs.input_stream(service), {"lbs-input": lbs.encode_input("c")})
    handled: list[str] = []
    client = lbs.SyncClient(redis_server.url, service, "sync2", cfg, load_entrypoint_plugins=False)

    def handler(note: lbs.Notification) -> None:
        handled.append(note.stream)

    runner = threading.Thread(target=client.run, args=(handler,))
    runner.start()
    # b (handed back by the first close) and c are handled, then finished:
    # the LBS empties. Polled: nothing announces an XDEL.
    deadline = time.monotonic() + 10
    while r.xlen(lbs.input_stream(service)) and time.monotonic() < deadline:
        time.sleep(0.02)
    client.close()
    runner.join(10)
    assert not runner.is_alive()
    assert sorted(handled) == ["b", "c"]
    assert r.xlen(lbs.input_stream(service)) == 0
    r.close()
