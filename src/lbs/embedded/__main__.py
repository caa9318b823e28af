"""``python -m lbs.embedded``: print the redis-server that would be used."""

from __future__ import annotations

import sys

from ..exceptions import ServerNotFoundError
from .binaries import find_redis_server


def _main(argv: list[str] | None = None) -> int:  # pragma: no cover - manual use
    """``python -m lbs.embedded``: print the redis-server that would be used."""
    try:
        print(find_redis_server())
    except ServerNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


raise SystemExit(_main())
