"""``lbs dashboard``: a web application showing a fleet's services live, served by the ``lbs``
command (the ``[dashboard]`` extra: Starlette, uvicorn, Jinja2, itsdangerous).

:func:`create_app` builds the ASGI app of a :class:`DashboardSettings`; the pages are rendered on
the server (:mod:`.pages`, :mod:`.actions`, templates in ``templates/``), the charts are SVG drawn
on the server (:mod:`.charts`), the live counters come over server-sent events (:mod:`.live`),
everything read from Redis goes through :mod:`.data`, and who may act through :mod:`.security`.
"""

from __future__ import annotations

from .app import create_app
from .settings import DashboardSettings

__all__ = ["DashboardSettings", "create_app"]
