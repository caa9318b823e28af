"""``scripts/redis.sh``: its stdout is only the server's path (``make`` captures it), whatever it says on stderr.

The build itself (minutes) is not run here: these are the paths that find a
server at once. The binaries are stand-ins that answer ``--version`` as
redis-server does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from lbs.embedded import redis_server_version

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "redis.sh"
#: The script's PATH here: the tools it uses, and no redis-server but the system's.
SEARCH_PATH = "/usr/bin:/bin"


def _fake_server(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f'#!/bin/sh\necho "Redis server v={version} sha=00000000:0 malloc=libc bits=64 build=0"\n'
    )
    path.chmod(0o755)
    return path


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LBS_REDIS_SERVER", "LBS_REDIS7_SERVER", "LBS_REDIS_MIN_VERSION")
    }
    base.update({"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": SEARCH_PATH, **env})
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=base, timeout=60
    )


def test_a_cached_build_is_found_at_once_and_stdout_is_only_its_path(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "lbs" / "redis"
    _fake_server(cache / "8.4.0" / "bin" / "redis-server", "8.4.0")
    newest = _fake_server(cache / "8.6.3" / "bin" / "redis-server", "8.6.3")
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    # A redis-server >= 8.4 on PATH comes before the cache (not so with Debian's 7.0 there).
    system = shutil.which("redis-server", path=SEARCH_PATH)
    expected = system if system and (redis_server_version(system) or ()) >= (8, 4) else str(newest)
    assert proc.stdout == f"{expected}\n"
    assert "building" not in proc.stderr  # nothing was fetched or built


def test_lbs_redis_server_is_taken_as_it_is_and_checked(tmp_path: Path) -> None:
    given = _fake_server(tmp_path / "mine" / "redis-server", "8.6.1")
    proc = _run(tmp_path, LBS_REDIS_SERVER=str(given))
    assert (proc.returncode, proc.stdout) == (0, f"{given}\n")
    old = _fake_server(tmp_path / "old" / "redis-server", "7.0.15")
    proc = _run(tmp_path, LBS_REDIS_SERVER=str(old))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert "is not a redis-server >= 8.4" in proc.stderr


def test_help_says_what_a_build_does_and_costs(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--help")
    assert proc.returncode == 0
    assert "--rebuild" in proc.stdout and "Debian's source package of Redis" in proc.stdout
    assert "min on 2 cores" in proc.stdout


def test_a_wrong_argument_is_a_usage_error(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--no-such-option")
    assert (proc.returncode, proc.stdout) == (2, "")
    assert "unknown argument" in proc.stderr


def test_redis7_finds_a_7x_and_never_an_8x(tmp_path: Path) -> None:
    """``--redis7``: the fallback tests' server, from $LBS_REDIS7_SERVER, PATH or the cache (7.x only)."""
    cache = tmp_path / "cache" / "lbs" / "redis"
    _fake_server(cache / "8.6.3" / "bin" / "redis-server", "8.6.3")
    seven = _fake_server(cache / "7.0.15" / "bin" / "redis-server", "7.0.15")
    proc = _run(tmp_path, "--redis7")
    # A 7.x on PATH (Debian's redis-server package) comes before the cache; an 8.x there never does.
    system = shutil.which("redis-server", path=SEARCH_PATH)
    expected = (
        system if system and (7, 0) <= (redis_server_version(system) or ()) < (8, 0) else str(seven)
    )
    assert (proc.returncode, proc.stdout) == (0, f"{expected}\n"), proc.stderr
    given = _fake_server(tmp_path / "mine" / "redis-server", "7.2.4")
    proc = _run(tmp_path, "--redis7", LBS_REDIS7_SERVER=str(given))
    assert (proc.returncode, proc.stdout) == (0, f"{given}\n")
    proc = _run(
        tmp_path, "--redis7", LBS_REDIS7_SERVER=str(cache / "8.6.3" / "bin" / "redis-server")
    )
    assert (proc.returncode, proc.stdout) == (1, "")
    assert "is not a redis-server >= 7.0 and < 8.0" in proc.stderr
