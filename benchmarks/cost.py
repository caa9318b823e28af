"""What Redis pays over a window of a benchmark: INFO cpu and INFO commandstats, before and after.

``await Window.open(r)`` takes INFO commandstats, then INFO cpu; ``await
window.close()`` takes INFO cpu, then INFO commandstats, and returns the
:class:`Cost` in between: Redis's CPU (``used_cpu_sys + used_cpu_user``, every
client of the server and its own background work counted) and, per command,
the calls and the microseconds Redis spent in them. Commands a Lua script
runs count under their own name as well as inside ``evalsha``'s time. The
window's own INFO calls (three fall inside it) are taken out of ``info``'s
calls (not its microseconds, which are tiny).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

#: The INFO calls of the window itself that land in its commandstats delta.
_OWN_INFO_CALLS = 3


@dataclass(frozen=True)
class Cost:
    """Redis's cost over one window."""

    #: Wall-clock length of the window, seconds.
    seconds: float
    #: Redis CPU (system + user) over the window, seconds.
    cpu: float
    #: Per command (``xreadgroup``, ``evalsha``, ``client|id``...): (calls, microseconds).
    commands: dict[str, tuple[int, int]]

    def per(self, n: float) -> dict[str, list[float]]:
        """Calls and microseconds per ``n`` (messages, assignments, client-seconds): ``{cmd: [calls, usec]}``,
        the costliest command first; commands whose figures round to 0 (set-up, a call or two per
        window) are left out."""
        rows = sorted(self.commands.items(), key=lambda kv: -kv[1][1])
        out = {cmd: [round(calls / n, 3), round(usec / n, 2)] for cmd, (calls, usec) in rows}
        return {cmd: v for cmd, v in out.items() if v != [0, 0]}


def _commands(stats: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {
        key.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for key, v in stats.items()
        if key.startswith("cmdstat_")
    }


async def _cpu(r: aioredis.Redis) -> float:
    info = await r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


class Window:
    """A measured window on ``r``'s server; see the module docstring."""

    def __init__(self, r: aioredis.Redis, commands: dict[str, tuple[int, int]], cpu: float) -> None:
        self.r = r
        self.commands0 = commands
        self.cpu0 = cpu
        self.wall0 = time.perf_counter()

    @classmethod
    async def open(cls, r: aioredis.Redis) -> Window:
        commands = _commands(await r.info("commandstats"))
        return cls(r, commands, await _cpu(r))

    async def close(self) -> Cost:
        cpu = await _cpu(self.r)
        wall = time.perf_counter() - self.wall0
        after = _commands(await self.r.info("commandstats"))
        delta: dict[str, tuple[int, int]] = {}
        for cmd, (calls, usec) in after.items():
            calls0, usec0 = self.commands0.get(cmd, (0, 0))
            if cmd == "info":
                calls0 += _OWN_INFO_CALLS
            if calls > calls0:
                delta[cmd] = (calls - calls0, usec - usec0)
        return Cost(wall, cpu - self.cpu0, delta)


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of already sorted values (nearest rank); 0.0 when empty."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def combined(costs: list[Cost]) -> Cost:
    """Several servers' costs over one window (a cluster's masters) as one: CPU and calls added up."""
    commands: dict[str, tuple[int, int]] = {}
    for c in costs:
        for cmd, (calls, usec) in c.commands.items():
            calls0, usec0 = commands.get(cmd, (0, 0))
            commands[cmd] = (calls0 + calls, usec0 + usec)
    return Cost(max(c.seconds for c in costs), sum(c.cpu for c in costs), commands)
