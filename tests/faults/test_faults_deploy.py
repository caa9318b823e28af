"""Fault 20: rolling deploys. ``lbs worker`` processes under a steady producer, with handlers of
several lengths (most short, some longer than the lock TTL, some longer than the drain), replaced
in rounds as a Kubernetes Deployment does it (maxSurge 1, maxUnavailable 0): the replacement starts,
then the old worker gets SIGTERM and drains while the next step goes on.

Every handler run is written to an audit stream in Redis (``_deploy_handler.py``: start, then end or
cancelled, synchronously, before lbs finishes or hands back the stream), so its order is the order
of the runs in every process. The audit requires:

* no data stream ever runs in two processes at once (a start while another run of the same
  stream has neither ended nor been cancelled);
* nothing that ended runs again (a start after an end: a finished stream run twice);
* nothing is lost (every registered stream ends, within a bound);
* every worker exits 0, and none logs a lost lock.

The settings keep the defaults' proportions: ``drain_timeout`` twice ``lock_ttl`` (20 s and 10 s),
``read_block`` and everything else as ``Config()`` has them. The full size (``make faults``) runs the
defaults themselves (10 s TTL, 20 s drain, handlers of 15 and 25 s); the smoke size divides the
TTL, the drain and the long handlers by five.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import lbs

from _fleet import (
    FULL,
    HERE,
    TEST_TIMEOUT,
    Figures,
    Report,
    eventually,
    read_audit,
    server,
    verdict,
)

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)

#: Seconds of the defaults' time scale (1 at the full size: Config()'s own 10 s TTL, 20 s drain).
UNIT = 1.0 if FULL else 0.2
LOCK_TTL, DRAIN = 10.0 * UNIT, 20.0 * UNIT
#: Rounds of the deploy (each replaces every worker once) and registrations a second.
ROUNDS = 3 if FULL else 2
RATE = 40.0 if FULL else 20.0


def workers_for_this_machine() -> int:
    """Two workers on a 2-core machine, up to six where there are more cores."""
    return max(2, min(6, (os.cpu_count() or 2) // 2))


def work_of(rng: random.Random) -> float:
    """Most handlers short; one in ten longer than the lock TTL (inside the drain), one in twenty
    longer than the drain (cut by it, then handed back)."""
    x = rng.random()
    if x < 0.05:
        return 25.0 * UNIT
    if x < 0.15:
        return 15.0 * UNIT
    return rng.uniform(0.01, 0.1)


@dataclass
class Worker:
    label: str
    proc: subprocess.Popen[bytes]
    log: Path
    code: int | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Deploy:
    url: str
    service: str
    tmp: Path
    processes: int = 1
    keyed: bool = False
    shards: int = 1
    workers: list[Worker] = field(default_factory=list)
    n: int = 0

    def start(self) -> Worker:
        label = f"w{self.n}"
        self.n += 1
        log = self.tmp / f"{label}.log"
        env = dict(os.environ)
        env.update(
            PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
            LBS_URL=self.url,
            LBS_SERVICE=self.service,
            LBS_LOAD_PLUGINS="",
            DEPLOY_WORKER=label,
        )
        # One worker of each round runs --processes 2 (a supervisor and its children) where asked.
        extra = ["--processes", str(self.processes)] if self.processes > 1 else []
        extra += ["--shards", str(self.shards)] if self.shards > 1 else []
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "lbs",
                    "worker",
                    "_deploy_handler:handle_keyed" if self.keyed else "_deploy_handler:handle",
                    "--consumer-id",
                    f"deploy-{label}",
                    "--lock-ttl",
                    str(LOCK_TTL),
                    "--drain-timeout",
                    str(DRAIN),
                    "--log-format",
                    "json",
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        w = Worker(label, proc, log)
        self.workers.append(w)
        return w

    async def started(self, w: Worker, timeout: float = 60.0) -> None:
        want = max(1, self.processes) * self.shards  # a shard's client says it started, each

        async def up() -> bool:
            if w.proc.poll() is not None:
                raise AssertionError(f"{w.label} exited with {w.proc.returncode}: {w.output()}")
            return w.output().count("started on") >= want

        assert await eventually(up, timeout), f"{w.label} did not start: {w.output()[-2000:]}"

    def stop_all(self) -> None:
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()


def audit(events: list[dict[str, str]]) -> tuple[list[str], list[str], set[str]]:
    """(overlaps, ended then run again, names that ended) from the audit stream, in its order."""
    running: dict[str, list[dict[str, str]]] = {}
    ended: set[str] = set()
    overlaps: list[str] = []
    again: list[str] = []
    for ev in events:
        if ev["ev"] not in ("start", "end", "cancelled"):
            continue  # the test's own markers (paused, resumed)
        name = ev["name"]
        runs = running.setdefault(name, [])
        key = (ev["pid"], ev["token"], ev["entry"])
        if ev["ev"] == "start":
            if runs:
                other = runs[0]
                overlaps.append(
                    f"{name}: {ev['worker']} (pid {ev['pid']}, token {ev['token']}) started while "
                    f"{other['worker']} (pid {other['pid']}, token {other['token']}) ran it"
                )
            if name in ended:
                again.append(f"{name}: run again by {ev['worker']} after it ended")
            runs.append(ev)
        else:
            running[name] = [r for r in runs if (r["pid"], r["token"], r["entry"]) != key]
            if ev["ev"] == "end":
                ended.add(name)
    return overlaps, again, ended


def started_while_paused(events: list[dict[str, str]], fence: int) -> list[str]:
    """The runs started between the pause and resume markers on a take after the pause (a fencing
    token above ``fence``, the counter when the pause returned)."""
    out: list[str] = []
    pausing = False
    for ev in events:
        if ev["ev"] in ("paused", "resumed"):
            pausing = ev["ev"] == "paused"
        elif pausing and ev["ev"] == "start" and int(ev["token"]) > fence:
            out.append(
                f"{ev['name']}: {ev['worker']} started it with token {ev['token']} > {fence}"
            )
    return out


@pytest.mark.parametrize(
    ("processes", "keyed", "rounds", "shards", "paused"),
    [
        (1, False, ROUNDS, 1, False),
        (2, False, 1 if not FULL else ROUNDS, 1, False),
        (1, True, 1 if not FULL else ROUNDS, 1, False),
        (1, False, 1 if not FULL else ROUNDS, 4, False),
        (1, False, 1, 1, True),
    ],
    ids=["processes-1", "processes-2", "run_keyed", "shards-4", "paused"],
)
async def test_rolling_deploys_keep_every_stream_in_one_process(
    service: str,
    report: Report,
    processes: int,
    keyed: bool,
    rounds: int,
    shards: int,
    paused: bool,
) -> None:
    """``processes-2``: each worker a supervisor of two (``--processes 2``); ``run_keyed``: keys
    published with ``lbs.Publisher``, a message each, audited per key; ``shards-4``: a sharded LBS
    (``--shards 4``: the four shards' clients of a worker share its slots); ``paused``: the service
    is paused (``lbs.ServiceControls``) for the whole deploy, then resumed: no handler starts on a
    take after the pause (every start between the pause and the resume has a fencing token the
    counter had reached when the pause returned), the producer's registrations and what the
    drains hand back wait in the LBS, and all of it runs once resumed."""
    rng = random.Random(42)
    k = workers_for_this_machine() if processes == 1 else 2
    names: list[str] = []
    fence = 0
    with server() as srv, tempfile.TemporaryDirectory() as tmp:
        r = aioredis.Redis.from_url(srv.url)
        producer = lbs.Producer(srv.url, service, shards=shards)
        publisher = lbs.Publisher(srv.url, service)
        deploy = Deploy(srv.url, service, Path(tmp), processes, keyed, shards)
        stop = asyncio.Event()

        async def produce() -> None:
            i = 0
            while not stop.is_set():
                name = f"s{i}"
                i += 1
                if keyed:
                    await publisher.publish(name, {"work": str(work_of(rng))})
                else:
                    await producer.add_stream(name, {"work": work_of(rng)})
                names.append(name)
                await asyncio.sleep(1 / RATE)

        feeder: asyncio.Task[None] | None = None
        try:
            old = [deploy.start() for _ in range(k)]
            for w in old:
                await deploy.started(w)
            feeder = asyncio.create_task(produce())
            await asyncio.sleep(3 * LOCK_TTL)  # long handlers under way before the first SIGTERM
            controls = lbs.ServiceControls(r, service)
            if paused:
                await controls.pause("test_faults_deploy", "the whole deploy")
                fence = int(await r.get(lbs.fence_key(service)) or 0)
                await r.xadd(f"{service}-audit", {"ev": "paused"})
            for _ in range(rounds):
                for i, w in enumerate(old):
                    new = deploy.start()
                    await deploy.started(new)
                    w.proc.send_signal(signal.SIGTERM)
                    old[i] = new
                    await asyncio.sleep(LOCK_TTL / 2)  # the next step while this one drains
            if paused:
                await r.xadd(f"{service}-audit", {"ev": "resumed"})
                await controls.resume("test_faults_deploy")
            stop.set()
            await feeder
            feeder = None

            # Every old worker exits by itself within its drain, hand-back and shutdown.
            async def exited(w: Worker) -> None:
                w.code = await asyncio.to_thread(w.proc.wait, DRAIN + 30)

            await asyncio.gather(*(exited(w) for w in deploy.workers if w not in old))

            async def all_ended() -> bool:
                events = await read_audit(r, f"{service}-audit")
                return len(audit(events)[2]) >= len(names)

            settled = await eventually(all_ended, timeout=60 * UNIT + 60, every=0.5)
            for w in old:
                w.proc.send_signal(signal.SIGTERM)
            await asyncio.gather(*(exited(w) for w in old))
            events = await read_audit(r, f"{service}-audit")
            lbs_left = sum(
                [await r.xlen(lbs.input_stream(svc)) for svc in lbs.shard_services(service, shards)]
            )
        finally:
            stop.set()
            if feeder is not None:
                feeder.cancel()
            deploy.stop_all()
            await producer.close()
            await publisher.close()
            await r.aclose()
        overlaps, again, ended = audit(events)
        while_paused = started_while_paused(events, fence) if paused else []
        lost = [n for n in names if n not in ended]
        starts = sum(1 for e in events if e["ev"] == "start")
        cancelled = sum(1 for e in events if e["ev"] == "cancelled")
        codes = {w.label: w.code for w in deploy.workers}
        bad_exits = {label: c for label, c in codes.items() if c != 0}
        lock_lost = [
            f"{w.label}: {line[:300]}"
            for w in deploy.workers
            for line in w.output().splitlines()
            if "lock_lost" in line or "lost the lock" in line
        ]
        fig = Figures(
            f"rolling-deploy-{'keyed' if keyed else f'{processes}p'}"
            + (f"-{shards}shards" if shards > 1 else "")
            + ("-paused" if paused else ""),
            registered=len(names),
            handled=starts,
            finished=len(ended),
            faults=len(deploy.workers) - k,
            lost=len(lost),
            duplicated=len(again),
            retries=0,
            dead_letters=0,
            two_valid_holders=len(overlaps),
            extra=dict(
                workers=k,
                rounds=rounds,
                lock_ttl=LOCK_TTL,
                drain=DRAIN,
                cut_by_drain=cancelled,
                settled=settled,
                lbs_left=lbs_left,
                exit_codes=json.dumps(codes, separators=(",", ":")),
            ),
        )
    report(fig)
    problems = fig.problems(retries=False)
    if overlaps:
        problems.append(f"a stream ran in two processes at once: {overlaps[:5]}")
    if again:
        problems.append(f"a stream that ended ran again: {again[:5]}")
    if while_paused:
        problems.append(f"a take after the pause started a handler: {while_paused[:5]}")
    if bad_exits:
        problems.append(f"workers that did not exit 0: {bad_exits}")
    if lock_lost:
        problems.append(f"a worker lost a lock it held: {lock_lost[:5]}")
    if lost:
        problems.append(f"never ended: {lost[:10]}")
    verdict(problems)
