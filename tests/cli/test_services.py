"""``lbs services``, and a mistyped service name (issue 47): every command that reads a service exits 1
with one line naming the closest services there are (the URL's password masked), a service whose LBS
exists is never refused, and ``lbs worker`` starts a new service but says so first."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from typer.testing import CliRunner, Result

import lbs
from lbs import _keys
from lbs.cli import app
from lbs.status import list_services, require_service, service_summaries

from _cli_helpers import HANDLERS, Proc, cli_env, eventually, flat, run_lbs
from _helpers import client, produce, take

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def cli(*args: str) -> Result:
    """``lbs ARGS`` in-process, on the ``lbs`` app itself (in a thread: the commands run their own loop)."""
    runner = CliRunner(env={"COLUMNS": "200"})
    return await asyncio.to_thread(runner.invoke, app, list(args), catch_exceptions=False)


def typo(service: str) -> str:
    """``service`` with its last character mistyped (the fixture's names end in hex digits)."""
    return service[:-1] + "x"


# (before the service, after it): the commands that read a service.
COMMANDS = [
    (["status"], []),
    (["status"], ["--json"]),
    (["dlq", "list"], []),
    (["dlq", "show"], ["1-1"]),
    (["dlq", "replay"], ["--all"]),
    (["dlq", "purge"], ["--all", "--yes"]),
    (["claim"], ["1-1"]),
]


@pytest.mark.parametrize("before, after", COMMANDS, ids=lambda a: " ".join(a) or "-")
async def test_a_mistyped_service_exits_1_with_one_line_naming_the_closest(
    redis_server: Any, r: aioredis.Redis, service: str, before: list[str], after: list[str]
) -> None:
    url = redis_server.url
    await produce(url, service, "a")
    wrong = typo(service)
    result = await cli(*before, wrong, *after, "--url", url)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"no service {wrong!r} on {url}; did you mean {service!r}" in lines[0]
    if "--json" in after:
        assert json.loads(result.stdout)["exists"] is False  # the document, as before
    else:
        assert result.stdout == ""
    # Nothing was written under the wrong name.
    assert await r.exists(_keys.input_stream(wrong), _keys.dead_letter_stream(wrong)) == 0


async def test_the_message_masks_the_password_and_lists_the_services_when_none_is_close(
    redis_server: Any, service: str
) -> None:
    await produce(redis_server.url, service, "a")
    # The default user has no password: any one is accepted, and must not be shown.
    url = redis_server.url.replace("redis://", "redis://default:s3cret-word@", 1)
    result = await cli("dlq", "list", "qqqqqqqqqqqqqqqqqqqqqqqq", "--url", url)
    assert result.exit_code == 1
    said = flat(result.stderr)
    assert "s3cret-word" not in said and "redis://default:***@" in said
    assert "no service 'qqqqqqqqqqqqqqqqqqqqqqqq' on" in said and "; the services there: " in said
    with pytest.raises(lbs.NoSuchServiceError) as info:
        await require_service(url, typo(service))
    assert info.value.suggestions[0] == service and "s3cret-word" not in str(info.value)


async def test_without_scan_a_mistyped_name_is_still_refused(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    user, password = f"noscan-{service[-8:]}", "n0-scan-password"
    await r.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "+@all", "-scan")
    try:
        url = redis_server.url.replace("redis://", f"redis://{user}:{password}@", 1)
        await produce(url, service, "a")
        result = await cli("status", service, "--url", url)
        assert result.exit_code == 0, result.output
        result = await cli("dlq", "list", typo(service), "--url", url)
        assert result.exit_code == 1
        said = flat(result.stderr)
        assert f"no service {typo(service)!r} on redis://{user}:***@" in said
        assert "could not be listed: the ACL refuses SCAN" in said and password not in said
    finally:
        await r.execute_command("ACL", "DELUSER", user)


async def test_a_service_whose_lbs_exists_is_never_refused(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    """A first use: the LBS exists (its group made), nothing delivered, no dead letter yet."""
    url = redis_server.url
    await r.xgroup_create(
        _keys.input_stream(service), _keys.group_name(service), id="0", mkstream=True
    )
    result = await cli("status", service, "--url", url)
    assert result.exit_code == 0, result.output
    result = await cli("dlq", "list", service, "--url", url)
    assert result.exit_code == 0 and "No dead letters (0 in the stream)" in result.stdout
    result = await cli("dlq", "replay", service, "--all", "--url", url)
    assert result.exit_code == 0 and "nothing replayed" in result.stdout
    result = await cli("claim", service, "1-1", "--url", url)
    assert result.exit_code == 0 and "not pending" in result.stdout
    # Dead letters whose LBS is gone are still a service's to list and replay.
    other = service + "-letters"
    await r.xadd(_keys.dead_letter_stream(other), {"lbs-input": '{"DataStreamName":"d","Info":{}}'})
    result = await cli("dlq", "list", other, "--url", url)
    assert result.exit_code == 0 and "dead letters of" in result.stdout


async def test_services_lists_each_service_with_its_counts(
    redis_server: Any, r: aioredis.Redis, service: str
) -> None:
    url = redis_server.url
    waiting, busy = service + "-a", service + "-b"
    await produce(url, waiting, "w1", "w2", "w3")
    await produce(url, busy, "b1", "b2")
    await r.xadd(_keys.dead_letter_stream(busy), {"lbs-input": "{bad", "_reason": "test"})
    # Streams that are no service: a service's keyed stream, a hash named like an LBS.
    await r.xadd("{" + _keys.input_stream(busy) + "}:k:x-input", {"f": "v"})
    await r.hset(service + "-hash-input", "f", "v")
    c = client(url, busy, "w1", max_streams=1)
    await c.start()
    try:
        await take(c, 1)
        result = await cli("services", "--url", url, "--json")
        assert result.exit_code == 0, result.output
        rows = {row["service"]: row for row in json.loads(result.stdout)}
        assert service + "-hash" not in rows and not any("{" in name for name in rows)
        assert (rows[waiting]["backlog"], rows[waiting]["pending"], rows[waiting]["alive"]) == (
            3,
            0,
            0,
        )
        b = rows[busy]
        assert (b["backlog"], b["pending"], b["alive"], b["dead_letters"]) == (1, 1, 1, 1)
        result = await cli("services", "--url", url)
        assert result.exit_code == 0
        screen = flat(result.stdout)
        assert f"{waiting} 3 0 0 alive 0" in screen and f"{busy} 1 1 1 alive 1" in screen
    finally:
        await c.close()


async def test_services_on_a_cluster_are_read_from_every_master(
    redis_cluster: Any, service: str
) -> None:
    url = "redis+cluster://" + redis_cluster.url.split("://", 1)[1]
    # One service in each third of the slots: each master of the three holds one.
    names, i = {}, 0
    while len(names) < 3:
        name = f"{service}-{i}"
        names.setdefault(key_slot(_keys.input_stream(name).encode()) * 3 // 16384, name)
        i += 1
    for name in names.values():
        await produce(url, name, "a", "b")
    assert set(names.values()) <= set(await list_services(url))
    rows = [s for s in await service_summaries(url) if s.service in names.values()]
    assert len({s.node for s in rows}) == 3 and all(s.backlog == 2 for s in rows)
    wrong = names[0] + "s"  # the closest is names[0] (the others differ in its index)
    result = await cli("status", wrong, "--url", url)
    assert result.exit_code == 1
    assert f"no service {wrong!r} on {url}; did you mean {names[0]!r}" in flat(result.stderr)
    result = await cli("services", "--url", url)
    assert result.exit_code == 0 and all(n in flat(result.stdout) for n in names.values())


def test_the_dashboard_of_a_mistyped_service_exits_1(
    redis_server: Any, service: str, tmp_path: Path
) -> None:
    url = redis_server.url
    asyncio.run(produce(url, service, "a"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wrong = typo(service)
    done = run_lbs(
        ["dashboard", service, wrong, "--url", url, "--port", str(port)], cli_env(tmp_path / "log")
    )
    assert done.returncode == 1, done.stderr
    assert f"no service {wrong!r} on {url}; did you mean {service!r}?" in flat(done.stderr)
    assert "http://" not in done.stderr  # it served nothing


async def test_a_worker_of_a_new_service_says_so_once_and_starts_it(
    redis_server: Any,
    r: aioredis.Redis,
    service: str,
    start_worker: Callable[..., Proc],
    log: Path,
) -> None:
    url = redis_server.url
    await produce(url, service, "a")
    wrong = typo(service)
    worker = start_worker(
        f"{HANDLERS}:ok", "--service", wrong, "--url", url, "--processes", "2", "--consumer-id", "n"
    )
    said = f"service {wrong!r} does not exist on {url} yet: starting it (did you mean {service!r}"

    async def started() -> bool:  # the new service's group is there: its workers run
        return bool(await r.exists(_keys.input_stream(wrong)))

    await eventually(started, "the new service started")
    await produce(url, wrong, "n1")

    async def handled_it() -> bool:
        return " n1 " in log.read_text()

    await eventually(handled_it, "the new service's stream handled")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.err()
    assert flat(worker.err()).count(said) == 1, worker.err()  # once, by the supervisor


async def test_a_worker_of_an_existing_service_says_nothing_of_it(
    redis_server: Any, service: str, start_worker: Callable[..., Proc], log: Path
) -> None:
    url = redis_server.url
    await produce(url, service, "e1")
    worker = start_worker(f"{HANDLERS}:ok", "--service", service, "--url", url)

    async def handled_it() -> bool:
        return " e1 " in log.read_text()

    await eventually(handled_it, "the stream handled")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.err()
    assert "does not exist" not in worker.err()
