"""Helpers of tests/dashboard: what a page shows, read from its HTML."""

from __future__ import annotations

import re


def live(html: str, field: str, nth: int = 0) -> str:
    """The text of the ``nth`` element marked ``data-live="field"`` (the overview's counters)."""
    found = re.findall(rf'data-live="{field}"[^>]*>([^<]*)<', html)
    return found[nth]


def csrf(html: str) -> str:
    """The CSRF token a page's forms carry."""
    m = re.search(r'name="csrf(?:-token)?" (?:value|content)="([^"]+)"', html)
    assert m, html
    return m.group(1)
