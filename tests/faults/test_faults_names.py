"""Fault 14: one holder per data stream name, whatever the registrations, while consumers die.

Two producers register a few names over and over (a retry after an uncertain add, two services that
notice the same session) while three consumer processes (``_audit_worker.py``) run them; registrations
that kill the process that takes them (``os._exit``: no clean-up, its locks left to expire) are mixed
in, and each dead process is replaced. Every handler run is written to an audit stream, in the order
the server saw it: ``start`` and ``end`` of each run, ``dying`` as a process's last act. The audit then
replays it: a name started while a run of it was open (not ended, its process not dead) was held by
two at once; tokens of one name must grow across its holds; every registration must run to its end.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections import Counter

import pytest
import redis.asyncio as aioredis

import lbs

from _fleet import FULL, HERE, SETTLE, TEST_TIMEOUT, Figures, Report, eventually, server

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)

TTL = 2.0
NAMES = 6
REPEATS = 100 if FULL else 12  # registrations of each name by each producer
KILLS = 10 if FULL else 3
WORKERS = 3
WORKER = str(HERE / "_audit_worker.py")


class Workers:
    """Consumer processes; one that dies is replaced by a new one (a new consumer id)."""

    def __init__(self, url: str, service: str) -> None:
        self.url, self.service = url, service
        self.procs: list[asyncio.subprocess.Process] = []
        self.ids = itertools.count()
        self.deaths = 0

    async def start(self) -> None:
        self.procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                WORKER,
                self.url,
                self.service,
                f"w{next(self.ids)}",
                str(TTL),
                stdout=subprocess.DEVNULL,
            )
        )

    async def keep(self) -> None:
        """Replace every process that dies, until cancelled."""
        while True:
            for p in list(self.procs):
                if p.returncode is not None:
                    assert p.returncode == 3, f"a worker exited with {p.returncode}"
                    self.procs.remove(p)
                    self.deaths += 1
                    await self.start()
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                p.kill()
            await p.wait()


async def produce(url: str, service: str, who: str, kills: list[int]) -> list[str]:
    """Register each name REPEATS times (and the killing registrations ``kills`` at their turn); the
    registrations' ids."""
    regs = []
    async with lbs.Producer(url, service) as p:
        for k in range(REPEATS):
            batch = [(f"n{i}", {"reg": f"{who}-{k}-{i}"}) for i in range(NAMES)]
            if k * KILLS // REPEATS in kills and k % max(1, REPEATS // KILLS) == 0:
                kill = k * KILLS // REPEATS
                batch.append((f"kill-{kill}", {"reg": f"kill-{kill}", "kill": True}))
            await p.add_streams(batch)
            regs += [info["reg"] for _, info in batch]
            await asyncio.sleep(0.02)
    return regs


def replay(events: list[dict[str, str]]) -> tuple[list[str], list[str], Counter[str]]:
    """Two holders at once (one message each), tokens that did not grow, and runs ended per registration."""
    open_runs: dict[str, set[tuple[str, str]]] = {}
    last_token: dict[str, int] = {}
    twice, shrinking, ended = [], [], Counter[str]()
    for ev in events:
        kind = ev["ev"]
        if kind == "dying":
            for runs in open_runs.values():
                runs -= {r for r in runs if r[0] == ev["consumer"]}
            continue
        name, run = ev["name"], (ev["consumer"], ev["token"])
        runs = open_runs.setdefault(name, set())
        if kind == "start":
            if runs:
                twice.append(f"{name}: {run} started while {sorted(runs)} ran")
            runs.add(run)
            token = int(ev["token"])
            if token <= last_token.get(name, 0):
                shrinking.append(f"{name}: token {token} after {last_token[name]}")
            last_token[name] = token
        else:
            runs.discard(run)
            ended[ev["reg"]] += 1
    return twice, shrinking, ended


async def test_no_name_is_ever_held_by_two_while_consumers_die(
    service: str, report: Report
) -> None:
    with server() as srv:
        r = aioredis.Redis.from_url(srv.url, decode_responses=True)
        workers = Workers(srv.url, service)
        keeper = None
        try:
            for _ in range(WORKERS):
                await workers.start()
            keeper = asyncio.create_task(workers.keep())
            kills = list(range(KILLS))
            regs = [
                reg
                for part in await asyncio.gather(
                    produce(srv.url, service, "p0", kills[::2]),
                    produce(srv.url, service, "p1", kills[1::2]),
                )
                for reg in part
            ]
            audit = f"{service}-audit"

            async def all_ended() -> bool:
                ended = {f["reg"] for _, f in await r.xrange(audit) if f["ev"] == "end"}
                return ended >= set(regs)

            settled = await eventually(
                all_ended, timeout=SETTLE * 3, what="every registration run to its end"
            )
            events = [f for _, f in await r.xrange(audit)]
            waiting = sum(1 for f in events if f["ev"] == "start") - len(set(regs))
        finally:
            if keeper is not None:
                keeper.cancel()
            await workers.stop()
            await r.aclose()
    twice, shrinking, ended = replay(events)
    dying = sum(1 for f in events if f["ev"] == "dying")
    fig = Figures(
        "names-many-registrations-kills",
        len(regs),
        sum(ended.values()),
        len(ended),
        dying,
        len(set(regs) - set(ended)),
        sum(1 for n in ended.values() if n > 1),
        0,
        0,
        len(twice),
        extra={"names": NAMES + KILLS, "runs_again": waiting, "tokens_not_growing": len(shrinking)},
    )
    report(fig)
    assert settled, fig.line()
    assert dying == KILLS and workers.deaths == KILLS, fig.line()
    assert twice == [], twice[:5]
    assert shrinking == [], shrinking[:5]
    assert set(ended) == set(regs), fig.line()
