"""Charts drawn on the server as SVG (no JavaScript, no chart library): a per-minute bar chart of
the last hour, with its peak, its total and a tooltip per bar."""

from __future__ import annotations

import time
from collections.abc import Sequence

from markupsafe import Markup, escape

__all__ = ["bar_chart"]

WIDTH, HEIGHT = 600, 120
#: Room for the axis labels: left (the peak), bottom (the times).
LEFT, BOTTOM, TOP = 34, 18, 8


def _clock(ms: int) -> str:
    return time.strftime("%H:%M", time.gmtime(ms / 1000))


def bar_chart(
    values: Sequence[int], start_ms: int, *, label: str, kind: str, empty: str = ""
) -> Markup:
    """An SVG of ``values`` (one bar a minute from ``start_ms``, the server's clock, UTC labels).

    ``kind`` (``done`` or ``failed``) picks the bars' CSS class; ``label`` is the chart's
    accessible name; ``empty`` is written across a chart with nothing to draw.
    """
    n = max(1, len(values))
    peak = max(values, default=0)
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    step = plot_w / n
    bar_w = max(1.0, step - 1.5)
    parts = [
        f'<svg class="chart chart-{escape(kind)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" preserveAspectRatio="none" data-total="{sum(values)}">',
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 4}" y2="{TOP + plot_h}"/>',
        f'<line class="grid" x1="{LEFT}" y1="{TOP}" x2="{WIDTH - 4}" y2="{TOP}"/>',
        f'<text class="tick" x="{LEFT - 4}" y="{TOP + 4}" text-anchor="end">{peak}</text>',
        f'<text class="tick" x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>',
    ]
    for i, v in enumerate(values):
        h = 0.0 if peak == 0 else plot_h * v / peak
        x = LEFT + i * step
        minute = start_ms + i * 60_000
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{bar_w:.1f}" '
            f'height="{h:.1f}"><title>{_clock(minute)} UTC: {v}</title></rect>'
        )
    for i in range(0, n + 1, 15):
        x = LEFT + min(i, n) * step
        when = "now" if i >= n else f"-{n - i} min"
        anchor = "end" if i >= n else "start"
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 4}" text-anchor="{anchor}">{when}</text>'
        )
    if empty:
        parts.append(
            f'<text class="empty" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h / 2 + 4:.0f}" '
            f'text-anchor="middle">{escape(empty)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
