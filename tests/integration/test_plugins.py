"""Plugins: isolation of a failing plugin, provider hooks, batched hooks, entry-point discovery, and the
observer that samples the queue-length gauges plugins read."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

import lbs
from lbs._consumer.observer import Observer
from lbs.testing import probe

from _helpers import client, eventually, is_true, produce, take

FIXTURE = Path(__file__).parent.parent / "fixtures" / "lbs-tiny-plugin"


async def test_a_raising_plugin_is_logged_by_name_and_the_others_still_hear(
    redis_server: Any, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[str] = []

    class Broken:
        @lbs.hookimpl
        def lbs_lock_acquired(self, stream: str) -> None:
            raise RuntimeError(f"bug on {stream}")

    class Listener:
        @lbs.hookimpl
        def lbs_lock_acquired(self, stream: str) -> None:
            heard.append(stream)

    await produce(redis_server.url, service, "a", "b", "c")
    # Listener registered first, so pluggy's order calls Broken first: the
    # failure must not stop the call from reaching Listener.
    broken = Broken()
    c = lbs.Client(
        redis_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1),
        load_entrypoint_plugins=False,
        plugins=[Listener(), broken],
    )
    broken_name = c.pm.get_name(broken)
    assert broken_name
    caplog.set_level(logging.ERROR, logger="lbs")
    await c.start()
    try:
        notes = await take(c, 3)
        assert sorted(heard) == ["a", "b", "c"]
        assert [await c.done_stream(n.stream) for n in notes] == [lbs.DoneStatus.DONE] * 3
    finally:
        await c.close()
    failures = [
        r.getMessage()
        for r in caplog.records
        if "raised in hook lbs_lock_acquired" in r.getMessage()
    ]
    assert len(failures) == 3
    assert all(repr(broken_name) in m for m in failures)


async def test_run_takes_its_handler_from_a_plugin(redis_server: Any, service: str) -> None:
    handled: list[str] = []

    class Provider:
        @lbs.hookimpl
        def lbs_handler(self, client: lbs.Client) -> Any:
            async def handle(note: lbs.Notification) -> None:
                handled.append(note.stream)

            return handle

    class Declines:
        @lbs.hookimpl
        def lbs_handler(self) -> None:
            return None  # lets the next plugin answer

    await produce(redis_server.url, service, "x", "y")
    c = lbs.Client(
        redis_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1),
        load_entrypoint_plugins=False,
        plugins=[Provider(), Declines()],
    )
    runner = asyncio.create_task(c.run())
    await c.wait_finished(2)
    await c.close()
    await runner
    assert sorted(handled) == ["x", "y"]

    bare = client(redis_server.url, service)
    with pytest.raises(lbs.ConfigurationError, match="lbs_handler"):
        await bare.run()
    await bare.close()


async def test_stream_expired_tells_plugins_which_path_recovered_it(
    redis_server: Any, service: str, r: aioredis.Redis
) -> None:
    seen: list[tuple[str, int, str]] = []

    class Watcher:
        @lbs.hookimpl
        def lbs_stream_expired(self, stream: str, retry_count: int, path: str) -> None:
            seen.append((stream, retry_count, path))

    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    await produce(redis_server.url, service, "orphan")
    await r.xreadgroup(
        group, "redis-consumer-gone", {stream: ">"}, count=1
    )  # pending, never locked
    entry_id = (await r.xpending_range(stream, group, "-", "+", 1))[0]["message_id"].decode()
    c = lbs.Client(
        redis_server.url,
        service,
        "c",
        lbs.Config(read_block=0.1, recovery=False),
        load_entrypoint_plugins=False,
        plugins=[Watcher()],
    )
    try:
        assert await c.claim(entry_id) is True
    finally:
        await c.close()
    assert seen == [("orphan", 1, "claim")]


class Batched:
    """Hears the batched hooks and, for comparison, their per-stream forms."""

    def __init__(self) -> None:
        self.started: list[list[str]] = []
        self.released: list[list[tuple[str, lbs.DoneStatus]]] = []
        self.each_started: list[str] = []
        self.each_released: list[str] = []

    @lbs.hookimpl
    def lbs_streams_started(self, notifications: list[lbs.Notification]) -> None:
        assert all(n.type is lbs.NotificationType.STREAM_ADDED for n in notifications)
        self.started.append([n.stream for n in notifications])

    @lbs.hookimpl
    def lbs_locks_released(self, released: list[tuple[lbs.Held, lbs.DoneStatus]]) -> None:
        self.released.append([(h.stream, status) for h, status in released])

    @lbs.hookimpl
    def lbs_stream_started(self, notification: lbs.Notification) -> None:
        self.each_started.append(notification.stream)

    @lbs.hookimpl
    def lbs_lock_released(self, stream: str) -> None:
        self.each_released.append(stream)


async def test_batched_hooks_hear_a_read_and_a_finish_once(redis_server: Any, service: str) -> None:
    names = [f"s{i}" for i in range(20)]
    await produce(redis_server.url, service, *names)  # all there before the first read: one batch
    heard = Batched()
    c = client(redis_server.url, service, plugins=[heard])
    await c.start()
    try:
        notes = await take(c, 20)
        statuses = await c.done_streams(notes)
    finally:
        await c.close()
    assert heard.started == [names]
    assert heard.released == [[(n, lbs.DoneStatus.DONE) for n in names]]
    assert statuses == [lbs.DoneStatus.DONE] * 20
    # The per-stream forms still work, one call per stream.
    assert heard.each_started == names and heard.each_released == names


async def test_batched_hooks_under_run_cover_every_stream_once(
    redis_server: Any, service: str
) -> None:
    names = [f"s{i}" for i in range(30)]
    await produce(redis_server.url, service, *names)
    heard = Batched()
    c = client(redis_server.url, service, plugins=[heard])

    async def handler(note: lbs.Notification) -> None:
        await asyncio.sleep(0)

    runner = asyncio.create_task(c.run(handler))
    try:
        await c.wait_finished(30, timeout=20)
    finally:
        await c.close()
        await runner
    started = [s for batch in heard.started for s in batch]
    released = [
        s for batch in heard.released for s, status in batch if status is lbs.DoneStatus.DONE
    ]
    assert sorted(started) == sorted(released) == sorted(names)
    assert len(heard.started) < 30 and len(heard.released) < 30  # batched, not per stream


# ------------------------------------------------------------- the observer ---
#
# Client.start() runs it every Config.metrics_interval; here it is driven by hand
# on a client that is not started, against real servers (8.x, and 7.0's fallbacks).


async def _lbs_with_group(r: aioredis.Redis, url: str, service: str, n: int) -> list[str]:
    """``n`` entries in the LBS and the group, nothing delivered yet; their ids."""
    ids = await produce(url, service, *(f"s{i}" for i in range(n)))
    await r.xgroup_create(lbs.input_stream(service), lbs.group_name(service), id="0")
    return ids


async def test_observer_samples_backlog_pending_and_dead_letters(
    any_server: Any, service: str
) -> None:
    r = aioredis.Redis.from_url(any_server.url)
    c = client(any_server.url, service)
    try:
        await _lbs_with_group(r, any_server.url, service, 5)
        await r.xreadgroup(
            lbs.group_name(service), "someone", {lbs.input_stream(service): ">"}, count=2
        )
        await r.xadd(lbs.dead_letter_stream(service), {"_reason": "test"})
        assert await Observer(probe(c).state).sample()
        assert c.metrics.get("backlog_depth") == 3
        assert c.metrics.get("pel_depth") == 2
        assert c.metrics.get("dead_letter_depth") == 1
        assert c.metrics.series["backlog_depth"] == {(): 3}
    finally:
        await c.close()
        await r.aclose()


async def test_observer_counts_the_backlog_when_redis_cannot(any_server: Any, service: str) -> None:
    r = aioredis.Redis.from_url(any_server.url)
    c = client(any_server.url, service, dead_letter_stream="")
    try:
        ids = await _lbs_with_group(r, any_server.url, service, 4)
        await r.xreadgroup(
            lbs.group_name(service), "someone", {lbs.input_stream(service): ">"}, count=1
        )
        await r.xdel(
            lbs.input_stream(service), ids[2]
        )  # a deleted entry after the last delivered one ...
        (group,) = await r.xinfo_groups(lbs.input_stream(service))
        assert group.get("lag") is None  # ... so Redis cannot count the lag
        assert await Observer(probe(c).state).sample()
        assert c.metrics.get("backlog_depth") == 2  # XLEN 3 - 1 pending
        assert c.metrics.get("pel_depth") == 1
        assert "dead_letter_depth" not in c.metrics  # dead letters dropped: nothing to sample
    finally:
        await c.close()
        await r.aclose()


async def test_observer_before_the_lbs_exists_reports_empty_queues(
    redis_server: Any, service: str
) -> None:
    c = client(redis_server.url, service)
    try:
        assert await Observer(probe(c).state).sample()
        assert (
            c.metrics.get("backlog_depth"),
            c.metrics.get("pel_depth"),
            c.metrics.get("dead_letter_depth"),
        ) == (0, 0, 0)
    finally:
        await c.close()


async def test_observer_failures_are_logged_at_debug_and_retried(
    caplog: pytest.LogCaptureFixture, service: str
) -> None:
    c = client("redis://127.0.0.1:1", service, metrics_interval=0.01)  # nothing listens there
    observer = Observer(probe(c).state)
    try:
        with caplog.at_level(logging.DEBUG, logger="lbs"):
            assert not await observer.sample()
            observer.start()
            await eventually(
                lambda: is_true(
                    sum(
                        "sampling the queue lengths failed" in r.getMessage()
                        for r in caplog.records
                    )
                    >= 3
                )
            )
            assert observer.task is not None and not observer.task.done()  # never fatal: it goes on
            await observer.stop()
    finally:
        await c.close()
    assert all(r.levelno == logging.DEBUG for r in caplog.records if "sampling" in r.getMessage())
    assert "backlog_depth" not in c.metrics


async def test_observer_samples_every_interval_until_stopped(
    redis_server: Any, service: str
) -> None:
    r = aioredis.Redis.from_url(redis_server.url)
    c = client(redis_server.url, service, metrics_interval=0.01)
    try:
        await _lbs_with_group(r, redis_server.url, service, 2)
        observer = Observer(probe(c).state)
        observer.start()
        await eventually(lambda: is_true(c.metrics.get("backlog_depth") == 2))
        await produce(redis_server.url, service, "late")
        await eventually(lambda: is_true(c.metrics.get("backlog_depth") == 3))
        await observer.stop()
        assert observer.task is None
        quiet = client(redis_server.url, service, metrics_interval=0)
        off = Observer(probe(quiet).state)
        off.start()  # 0: no sampling
        assert off.task is None
        await quiet.close()
    finally:
        await c.close()
        await r.aclose()


CONSUMER = textwrap.dedent(
    """
    import asyncio, json, sys
    import lbs

    async def main(url, service, disabled):
        cfg = lbs.Config(read_block=0.1, disabled_plugins=tuple(filter(None, [disabled])))
        c = lbs.Client(url, service, consumer_id="tiny", config=cfg)
        print(json.dumps(sorted(name for name, p in c.pm.list_name_plugin() if p is not None)), flush=True)
        await c.start()
        async for note in c.notifications():
            await c.done_stream(note.stream)
            break
        await c.close()

    asyncio.run(main(*sys.argv[1:4]))
    """
)


@pytest.fixture(scope="module")
def tiny_plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture plugin, pip-installed into a directory of its own (not the test venv)."""
    target = tmp_path_factory.mktemp("tiny-plugin")
    source = shutil.copytree(
        FIXTURE, tmp_path_factory.mktemp("tiny-plugin-src") / "src"
    )  # builds write in-tree
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-build-isolation",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
    )
    return target


@pytest.mark.parametrize("disabled", [False, True], ids=["enabled", "disabled"])
async def test_an_installed_plugin_is_discovered_called_and_can_be_disabled(
    redis_server: Any, service: str, tiny_plugin_path: Path, tmp_path: Path, disabled: bool
) -> None:
    log = tmp_path / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "LBS_LOAD_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(tiny_plugin_path), env.get("PYTHONPATH")])
    )
    env["LBS_TINY_PLUGIN_LOG"] = str(log)
    await produce(redis_server.url, service, "work")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CONSUMER,
        redis_server.url,
        service,
        "tiny" if disabled else "",
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    names = json.loads(out.decode().splitlines()[0])
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    if disabled:
        assert "tiny" not in names and events == []
    else:
        assert "tiny" in names
        assert [e["event"] for e in events] == ["started", "acquired"]
        assert events[0]["consumer"].endswith("tiny") and events[1]["stream"] == "work"


class _Refuses:
    """A reader plugin that refuses every server (what lbs-claim did below 8.4)."""

    @lbs.hookimpl
    def lbs_reader(self, client: lbs.Client, server_version: tuple[int, ...]) -> lbs.ReadStrategy:
        raise lbs.ConfigurationError("this plugin refuses the server")


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_run_that_fails_at_start_makes_every_waiter_raise(
    redis_server: Any, service: str, keyed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """No silent death: run() (or run_keyed()) dies at start; wait_finished() and the notifications raise its
    error at once (they waited forever before), and the log has it with its traceback."""
    c = client(redis_server.url, service, plugins=[_Refuses()])

    async def handler(_: Any) -> None:
        return None

    worker = asyncio.create_task(c.run_keyed(handler) if keyed else c.run(handler))
    try:
        with pytest.raises(lbs.ConfigurationError, match="refuses the server"):
            await c.wait_finished(2, timeout=30)
        with pytest.raises(lbs.ConfigurationError, match="refuses the server"):
            await c.next_notification(timeout=30)
        with pytest.raises(lbs.ConfigurationError, match="refuses the server"):
            async for _ in c.notifications():
                pass
        with pytest.raises(lbs.ConfigurationError):
            await worker
        failed = [r for r in caplog.records if "run() failed" in r.getMessage()]
        assert (
            failed
            and failed[0].levelname == "ERROR"
            and "refuses the server" in failed[0].getMessage()
        )
    finally:
        await c.close()
        if not worker.done():
            worker.cancel()
