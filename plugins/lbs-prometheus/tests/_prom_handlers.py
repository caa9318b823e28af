"""A handler for ``lbs worker`` in test_prometheus_worker.py (imported from this directory)."""

from __future__ import annotations

import lbs


async def ok(note: lbs.Notification) -> None:
    """Finish at once."""
