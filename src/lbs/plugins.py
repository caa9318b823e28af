"""Building the plugin manager of a client.

Order: the built-in ``lbs-default-reader``, the plugins published under the
entry-point group ``lbs`` (unless turned off), then the plugins passed in,
then ``check_pending()`` so a misspelt hook fails loudly. pluggy asks the
last registered first, so a plugin the application passes outranks an
installed one, and both outrank the built-in. Entry-point plugins are
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
    if load_entrypoints:
        allow = os.environ.get("LBS_LOAD_PLUGINS")
        if allow is None:
            pm.load_setuptools_entrypoints(hookspecs.NAME)
        else:
            for name in filter(None, (n.strip() for n in allow.split(","))):
                pm.load_setuptools_entrypoints(hookspecs.NAME, name=name)
    # Registered last, so asked first: a plugin the application passes
    # outranks an installed one (an installed module passed again is kept once).
    for plugin in plugins:
        if not pm.is_registered(plugin):
            pm.register(plugin)
    pm.check_pending()
    if os.environ.get("LBS_TRACE_PLUGINS") == "1":
        def before(hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]) -> None:
            log.debug("hook %s(%s) -> %s", hook_name, ", ".join(kwargs), [i.plugin_name for i in impls])

        def after(outcome: pluggy.Result[Any], hook_name: str, impls: Sequence[pluggy.HookImpl],
                  kwargs: Mapping[str, Any]) -> None:
            pass

        pm.add_hookcall_monitoring(before, after)
    return pm


def plugin_config_defaults(pm: pluggy.PluginManager) -> dict[str, Any]:
    """The Config fields the plugins contribute (hook ``lbs_config_defaults``), merged.

    Two plugins giving one field different values, or a field Config does
    not have, is a :class:`lbs.ConfigurationError` naming them.
    """
    import dataclasses

    from .config import Config
    from .exceptions import ConfigurationError

    fields = {f.name for f in dataclasses.fields(Config)} - {"disabled_plugins"}
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    for impl in reversed(pm.hook.lbs_config_defaults.get_hookimpls()):
        name = impl.plugin_name
        defaults: Mapping[str, Any] = impl.function() or {}  # type: ignore[assignment]
        for key, value in defaults.items():
            if key not in fields:
                raise ConfigurationError(f"plugin {name!r} contributes a default for {key!r}, which is not a "
                                         "Config field it may set")
            if key in merged and merged[key] != value:
                raise ConfigurationError(f"plugins {source[key]!r} and {name!r} disagree on the default of "
                                         f"Config.{key}: {merged[key]!r} against {value!r}")
            merged[key], source[key] = value, name
    return merged
