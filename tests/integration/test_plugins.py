"""Plugins: isolation of a failing plugin, provider hooks, and entry-point discovery."""

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
from _helpers import client, produce, take

import lbs

FIXTURE = Path(__file__).parent.parent / "fixtures" / "lbs-tiny-plugin"


async def test_a_raising_plugin_is_logged_by_name_and_the_others_still_hear(
        redis_server: Any, service: str, caplog: pytest.LogCaptureFixture) -> None:
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
    c = lbs.Client(redis_server.url, service, "c", lbs.Config(read_block=0.1), load_entrypoint_plugins=False,
                   plugins=[Listener(), broken])
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
    failures = [r.getMessage() for r in caplog.records if "raised in hook lbs_lock_acquired" in r.getMessage()]
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
    c = lbs.Client(redis_server.url, service, "c", lbs.Config(read_block=0.1), load_entrypoint_plugins=False,
                   plugins=[Provider(), Declines()])
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
        redis_server: Any, service: str, r: aioredis.Redis) -> None:
    seen: list[tuple[str, int, str]] = []

    class Watcher:
        @lbs.hookimpl
        def lbs_stream_expired(self, stream: str, retry_count: int, path: str) -> None:
            seen.append((stream, retry_count, path))

    stream, group = lbs.input_stream(service), lbs.group_name(service)
    await r.xgroup_create(stream, group, id="0", mkstream=True)
    await produce(redis_server.url, service, "orphan")
    await r.xreadgroup(group, "redis-consumer-gone", {stream: ">"}, count=1)  # pending, never locked
    entry_id = (await r.xpending_range(stream, group, "-", "+", 1))[0]["message_id"].decode()
    c = lbs.Client(redis_server.url, service, "c", lbs.Config(read_block=0.1, recovery=False),
                   load_entrypoint_plugins=False, plugins=[Watcher()])
    try:
        assert await c.claim(entry_id) is True
    finally:
        await c.close()
    assert seen == [("orphan", 1, "claim")]


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
    source = shutil.copytree(FIXTURE, tmp_path_factory.mktemp("tiny-plugin-src") / "src")  # builds write in-tree
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--target", str(target), str(source)], check=True)
    return target


@pytest.mark.parametrize("disabled", [False, True], ids=["enabled", "disabled"])
async def test_an_installed_plugin_is_discovered_called_and_can_be_disabled(
        redis_server: Any, service: str, tiny_plugin_path: Path, tmp_path: Path, disabled: bool) -> None:
    log = tmp_path / "events.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "LBS_LOAD_PLUGINS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tiny_plugin_path), env.get("PYTHONPATH")]))
    env["LBS_TINY_PLUGIN_LOG"] = str(log)
    await produce(redis_server.url, service, "work")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CONSUMER, redis_server.url, service, "tiny" if disabled else "",
        env=env, stdout=asyncio.subprocess.PIPE)
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
