"""Free loopback ports below the ephemeral range, never handed out twice by this process."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

from ..exceptions import ServerStartError


def _ephemeral_floor() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return low


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_taken_ports: set[int] = set()
_ports_lock = threading.Lock()


def free_port(with_bus: bool = False) -> int:
    """A free loopback port below the ephemeral range.

    Ports from the ephemeral range can be handed to outgoing connections at
    any moment, so they are avoided. With ``with_bus`` the cluster bus port
    (port + 10000) must be free and below the ephemeral range too.
    """
    top = _ephemeral_floor() - (10000 if with_bus else 0)
    low = 10000
    if top - low < 1000:
        raise ServerStartError(f"no usable port range below the ephemeral floor {top}")
    with _ports_lock:
        for _ in range(200):
            port = random.randrange(low, top)
            if port in _taken_ports or (with_bus and port + 10000 in _taken_ports):
                continue
            if _port_is_free(port) and (not with_bus or _port_is_free(port + 10000)):
                _taken_ports.add(port)
                return port
    raise ServerStartError("could not find a free loopback port")


def release_port(port: int) -> None:
    """Let :func:`free_port` hand ``port`` out again (its server stopped)."""
    with _ports_lock:
        _taken_ports.discard(port)
