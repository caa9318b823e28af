"""Building the plugin manager of a client.

Order (tox's and pytest's): the plugins passed in, then the ones published
under the entry-point group ``lbs`` (unless turned off), then
``check_pending()`` so a misspelt hook fails loudly. Entry-point plugins are
enabled by installation; ``Config.disabled_plugins`` names the ones not to
load (by entry-point name), and ``LBS_LOAD_PLUGINS`` (comma-separated
entry-point names) allow-lists them. ``LBS_TRACE_PLUGINS=1`` logs every
hook call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pluggy

from . import hookspecs

log = logging.getLogger("lbs.plugins")


def make_plugin_manager(plugins: Iterable[object] = (), *, load_entrypoints: bool = True,
                        disabled: Iterable[str] = ()) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.NAME)
    pm.add_hookspecs(hookspecs)
    for name in disabled:
        pm.set_blocked(name)  # an entry point of that name is then skipped
    from .reading import DefaultReader  # the built-in behaviour is a plugin too, asked last

    pm.register(DefaultReader(), name="lbs-default-reader")
    for plugin in plugins:
        pm.register(plugin)
    if load_entrypoints:
        allow = os.environ.get("LBS_LOAD_PLUGINS")
        if allow is None:
            pm.load_setuptools_entrypoints(hookspecs.NAME)
        else:
            for name in filter(None, (n.strip() for n in allow.split(","))):
                pm.load_setuptools_entrypoints(hookspecs.NAME, name=name)
    pm.check_pending()
    if os.environ.get("LBS_TRACE_PLUGINS") == "1":
        def before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
            log.debug("hook %s(%s) -> %s", hook_name, ", ".join(kwargs), [i.plugin_name for i in impls])

        def after(outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl],
                  kwargs: Mapping[str, Any]) -> None:
            pass

        pm.add_hookcall_monitoring(before, after)
    return pm
