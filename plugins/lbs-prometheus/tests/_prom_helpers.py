"""Helpers for the lbs-prometheus tests (a distinct module name: the repo's
tests/integration has its own ``_helpers``)."""

from __future__ import annotations

import asyncio
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import lbs


def scrape(
    port: int, host: str = "127.0.0.1"
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """GET /metrics over real HTTP and parse it: {(sample name, labels): value}."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """GET ``path`` over real HTTP: (status, body), whatever the status."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def refused(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing answers on the port any more."""
    try:
        urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2).close()
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


def listening_ports(pid: int | str = "self") -> set[int]:
    """TCP ports the process listens on (Linux: /proc/<pid>/fd against /proc/net/tcp{,6})."""
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


async def take(client: lbs.Client, n: int, timeout: float = 10.0) -> list[lbs.Notification]:
    """The next ``n`` STREAM_ADDED notifications."""
    out: list[lbs.Notification] = []

    async def collect() -> None:
        async for note in client.notifications():
            if note.type is lbs.NotificationType.STREAM_ADDED:
                out.append(note)
                if len(out) == n:
                    return

    await asyncio.wait_for(collect(), timeout)
    return out


async def produce(url: str, service: str, *names: str) -> list[str]:
    async with lbs.Producer(url, service) as producer:
        return await producer.add_streams(names)


def prom_client(url: str, service: str, plugin: object, **config: Any) -> lbs.Client:
    """A client ``c1`` with ``plugin`` only (no entry-point plugins), reads of 0.1 s unless ``config`` says."""
    config.setdefault("read_block", 0.1)
    return lbs.Client(
        url,
        service,
        consumer_id="c1",
        config=lbs.Config(**config),
        plugins=[plugin],
        load_entrypoint_plugins=False,
    )
