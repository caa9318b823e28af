"""``lbs dashboard`` as an operator runs it: every action it serves is logged to stderr (as JSON with
``--log-format json``) with who did it, and a port already taken is one line naming ``--port``
before anything says it serves."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lbs.embedded import free_port

from _cli_helpers import START_TIMEOUT, Procs, cli_env, flat, run_lbs
from _helpers import produce

pytest.importorskip("uvicorn", reason="lbs dashboard needs the [dashboard] extra")

TOKEN = "t0ken-for-the-cli-test"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    started = Procs(tmp_path, cli_env(tmp_path / "log"))
    try:
        yield started
    finally:
        started.kill_all()


async def _serving(base: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    async with httpx.AsyncClient(base_url=base) as http:
        while True:
            try:
                await http.get("/login", timeout=2)
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"lbs dashboard not serving {base}") from None
                await asyncio.sleep(0.1)


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_every_action_is_logged_to_stderr_with_who(
    redis_server: Any, service: str, procs: Procs, fmt: str
) -> None:
    await produce(redis_server.url, service, "a")
    port = free_port()
    args = ["dashboard", service, "--url", redis_server.url, "--port", str(port), "--actions"]
    proc = procs.start(*args, "--token", TOKEN, *(["--log-format", fmt] if fmt == "json" else []))
    base = f"http://127.0.0.1:{port}"
    await _serving(base)
    async with httpx.AsyncClient(base_url=base) as http:
        assert (await http.get("/login", params={"token": "not-it"})).status_code == 403
        assert (await http.get("/login", params={"token": TOKEN})).status_code == 303
        purge = f"/s/{service}/dead-letters-all/purge"
        bearer = {"authorization": f"Bearer {TOKEN}"}
        assert (await http.post(purge, headers=bearer, data={"until": "1-0"})).status_code == 303
        assert (await http.post(purge, data={"csrf": "forged"})).status_code == 403
        page = (await http.get("/")).text
        csrf = re.search(r'name="csrf(?:-token)?" (?:value|content)="([^"]+)"', page)
        assert csrf, page
        assert (await http.post("/logout", data={"csrf": csrf.group(1)})).status_code == 303
    proc.signal(signal.SIGTERM)
    assert await proc.wait() == 0, proc.err()  # a clean stop
    err = proc.err()
    session = r"session [0-9a-f]+ from 127\.0\.0\.1"
    if fmt == "text":
        logged = [line for line in err.splitlines() if "lbs.dashboard" in line]
        expected = [
            r"WARNING lbs\.dashboard: session anonymous from 127\.0\.0\.1: a wrong token",
            rf"INFO lbs\.dashboard: {session}: signed in \(link\)",
            rf"INFO lbs\.dashboard: bearer from 127\.0\.0\.1: purge {service} letters "
            r"\(all, until 1-0\): purged 0 letter\(s\)",
            rf"WARNING lbs\.dashboard: {session}: purge {service} letters refused: "
            "missing or wrong CSRF token",
            rf"INFO lbs\.dashboard: {session}: signed out",
        ]
    else:
        records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
        logged = [
            " ".join(f"{k}={r.get(k)}" for k in ("level", "who", "action", "service", "message"))
            for r in records
            if r["logger"] == "lbs.dashboard"
        ]
        expected = [
            r"level=WARNING who=session anonymous from 127\.0\.0\.1 action=sign-in service=None",
            rf"level=INFO who={session} action=sign-in service=None message={session}: signed in",
            rf"level=INFO who=bearer from 127\.0\.0\.1 action=purge service={service} message="
            rf"bearer from 127\.0\.0\.1: purge {service} letters \(all, until 1-0\): purged 0",
            rf"level=WARNING who={session} action=purge service={service} .* refused",
            rf"level=INFO who={session} action=sign-out",
        ]
    assert len(logged) == len(expected), err
    for line, pattern in zip(logged, expected):
        assert re.search(pattern, line), (pattern, line)


def test_a_taken_port_is_one_line_naming_it_before_any_banner(
    redis_server: Any, service: str, tmp_path: Path
) -> None:
    asyncio.run(produce(redis_server.url, service, "a"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = run_lbs(
            ["dashboard", service, "--url", redis_server.url, "--port", str(port)],
            cli_env(tmp_path / "log"),
        )
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert flat(lines[0]) == (
        f"lbs dashboard: error: port {port} on 127.0.0.1 is in use by another program: stop it, "
        "or pick another port with --port"
    )
