"""The plugin host: building a client's plugin manager, and :class:`Hooks`, which calls it.

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
from typing import Any, Union, cast

import pluggy

from . import hookspecs
from .metrics import METRICS, Histogram

log = logging.getLogger("lbs.plugins")

__all__ = [
    "OWN_FIELDS",
    "WORKER_PROCESSES_ENV",
    "WORKER_SLOT_ENV",
    "Hooks",
    "MetricValues",
    "Series",
    "call_each",
    "collect",
    "make_plugin_manager",
    "merged_fields",
    "plugin_config_defaults",
    "worker_slot",
]

#: Set in each worker process of ``lbs worker --processes N``: its slot, 0 to N-1 (a restarted process keeps
#: its slot), and N. A plugin that binds something per process (a port) offsets it by the slot.
WORKER_SLOT_ENV = "LBS_WORKER_SLOT"
WORKER_PROCESSES_ENV = "LBS_WORKER_PROCESSES"


def worker_slot() -> tuple[int, int] | None:
    """``(slot, processes)`` in a worker process of ``lbs worker --processes N``; None elsewhere (or when the
    variables are not two integers with 0 <= slot < processes)."""
    try:
        slot, processes = int(os.environ[WORKER_SLOT_ENV]), int(os.environ[WORKER_PROCESSES_ENV])
    except (KeyError, ValueError):
        return None
    return (slot, processes) if 0 <= slot < processes else None


#: One metric's values by label values (in the order of its :attr:`lbs.metrics.Metric.labels`;
#: ``()`` when it has none): a counter's sum, a gauge's last value, a histogram's buckets.
Series = dict[tuple[str, ...], Union[float, "Histogram"]]


def make_plugin_manager(
    plugins: Iterable[object] = (), *, load_entrypoints: bool = True, disabled: Iterable[str] = ()
) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.NAME)
    pm.add_hookspecs(hookspecs)
    for name in disabled:
        pm.set_blocked(name)  # an entry point of that name is then skipped
    from .strategy import DefaultReader  # the built-in behaviour is a plugin too, asked last

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

        def before(
            hook_name: str, impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, Any]
        ) -> None:
            log.debug(
                "hook %s(%s) -> %s", hook_name, ", ".join(kwargs), [i.plugin_name for i in impls]
            )

        def after(
            outcome: pluggy.Result[Any],
            hook_name: str,
            impls: Sequence[pluggy.HookImpl],
            kwargs: Mapping[str, Any],
        ) -> None:
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
                raise ConfigurationError(
                    f"plugin {name!r} contributes a default for {key!r}, which is not a "
                    "Config field it may set"
                )
            if key in merged and merged[key] != value:
                raise ConfigurationError(
                    f"plugins {source[key]!r} and {name!r} disagree on the default of "
                    f"Config.{key}: {merged[key]!r} against {value!r}"
                )
            merged[key], source[key] = value, name
    return merged


class MetricValues(dict[str, float]):
    """A client's metric values by name (what :attr:`lbs.Client.metrics` returns), and by labels.

    As a dict: counters summed, gauges and histograms their last value, by
    name. :attr:`series` keeps every metric per label values too, with a
    histogram's every observation in buckets: what a metrics exporter reads
    at scrape time (``lbs-prometheus`` does), instead of hearing each event.
    Written on the client's event loop; a reader on another thread copies a
    metric's dict (``dict.copy()`` is atomic) before walking it.
    """

    __slots__ = ("series",)

    def __init__(self) -> None:
        super().__init__()
        #: Metric name -> label values -> value (see :data:`Series`).
        self.series: dict[str, Series] = {}


def call_each(
    impls: Sequence[pluggy.HookImpl],
    hook: str,
    kwargs: Mapping[str, Any],
    log: logging.LoggerAdapter | logging.Logger,  # type: ignore[type-arg]
) -> list[Any]:
    """Call each implementation of a 1:N hook (``impls``: its ``get_hookimpls()``) on its own, in pluggy's
    order (the last registered first, tryfirst/trylast kept), with the arguments it takes from ``kwargs``;
    their answers. One that raises is logged with its name and left out; the others are still called
    (pluggy would stop at the first)."""
    answers = []
    for impl in reversed(impls):
        if impl.hookwrapper or impl.wrapper:
            continue  # nothing to wrap: each is called on its own
        try:
            answers.append(impl.function(*[kwargs[name] for name in impl.argnames]))
        except Exception:
            log.exception("plugin %r raised in hook %s; ignored", impl.plugin_name, hook)
    return answers


#: Field names of an LBS entry that only lbs writes: no plugin may add them (hooks
#: ``lbs_message_fields``, ``lbs_hand_back_fields``), nor any starting with ``_`` (the managed fields).
OWN_FIELDS = frozenset(("lbs-input", "lbs-keyed"))


def merged_fields(
    impls: Sequence[pluggy.HookImpl],
    hook: str,
    kwargs: Mapping[str, Any],
    log: logging.LoggerAdapter | logging.Logger,  # type: ignore[type-arg]
) -> dict[str, str]:
    """The fields the implementations of a fields hook (``lbs_message_fields``, ``lbs_hand_back_fields``)
    answer, merged (a later answer wins for one name), each called on its own (:func:`call_each`).
    A name lbs writes itself, or a name or value that is not a str (or that UTF-8 cannot encode: a lone
    surrogate, which would fail the batch that carries it), is logged and left out."""
    merged: dict[str, str] = {}
    for answer in call_each(impls, hook, kwargs, log):
        if not answer:
            continue
        for name, value in answer.items():
            if type(name) is not str or type(value) is not str:
                log.error("hook %s: field %r = %r is not str to str; left out", hook, name, value)
            elif name in OWN_FIELDS or name.startswith("_") or not name:
                log.error("hook %s: field %r is lbs's own; left out", hook, name)
            elif not (name.isascii() and value.isascii()) and not _encodable(name + value):
                log.error(
                    "hook %s: field %r = %r holds a lone surrogate (UTF-8 cannot encode it); left out",
                    hook,
                    name,
                    value,
                )
            else:
                merged[name] = value
    return merged


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def collect(pm: pluggy.PluginManager, hook: str, /, **kwargs: Any) -> list[Any]:
    """Every plugin's answer to a 1:N hook that asks for one (``lbs_worker_banner``), each called on its
    own (:func:`call_each`); None answers left out."""
    impls = getattr(pm.hook, hook).get_hookimpls()
    return [a for a in call_each(impls, hook, kwargs, log) if a is not None] if impls else []


class Hooks:
    """How a client's activities reach the plugins: every call goes through here.

    * **isolation**: pluggy stops a 1:N hook call at the first implementation
      that raises; :meth:`notify` logs one plugin's bug with its name and
      every other plugin still hears the event, and the client goes on;
    * **anyone listening**: :meth:`listening` is cheap enough for a hot path
      to ask once per batch, and a notify nobody listens to costs one lookup;
    * **metrics**: :meth:`metric` keeps values by name (:attr:`counts`) and by
      name and labels (:attr:`series`), and calls ``lbs_metric`` (when someone
      listens) with the kind the table in :mod:`lbs.metrics` gives;
    * **tracing**: with ``LBS_TRACE_PLUGINS=1`` every call is logged.

    ``owner`` is what plugins receive as ``client``; ``labels`` go on every
    metric (``service`` and ``consumer``).
    """

    def __init__(
        self,
        pm: pluggy.PluginManager,
        owner: object,
        labels: Mapping[str, str],
        logger: logging.LoggerAdapter | logging.Logger,  # type: ignore[type-arg]
    ) -> None:
        self.pm = pm
        self.owner = owner
        self.labels = dict(labels)
        self.log = logger
        #: Metric values by name: counters summed, gauges and histograms the last value.
        self.counts = MetricValues()
        #: ... and by name and label values (``counts.series``; see :class:`MetricValues`).
        self.series = self.counts.series
        self._histogram = Histogram
        self._trace = os.environ.get("LBS_TRACE_PLUGINS") == "1"

    def listening(self, hook: str) -> bool:
        """True when some plugin implements ``hook``."""
        return bool(getattr(self.pm.hook, hook).get_hookimpls())

    def ask(self, hook: str, /, **kwargs: Any) -> Any:
        """Call a first-result hook (``lbs_reader``, ``lbs_handler``, ...); its answer, or None."""
        return getattr(self.pm.hook, hook)(client=self.owner, **kwargs)

    def wrap_handler(self, handler: Any, hook: str = "lbs_wrap_handler") -> Any:
        """``handler`` wrapped by every implementation of ``hook`` (``lbs_wrap_handler``, or
        ``lbs_wrap_keyed_handler``), in pluggy's order (each gets the previous one's answer; None
        leaves it as it was). Called once per ``run()`` or ``run_keyed()``."""
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            kwargs = {"client": self.owner, "handler": handler}
            wrapped = impl.function(*[kwargs[name] for name in impl.argnames])
            if wrapped is not None:
                handler = wrapped
        return handler

    def hand_back_fields(self, items: Sequence[Any], retry_counted: bool) -> list[list[str]]:
        """Per held stream handed back, the fields plugins set on its copy (hook
        ``lbs_hand_back_fields``, :func:`merged_fields`), flat; ``[]`` when nobody implements it."""
        hook = "lbs_hand_back_fields"
        impls = self.pm.hook.lbs_hand_back_fields.get_hookimpls()
        if not impls:
            return []
        out = []
        for held in items:
            kwargs = {"client": self.owner, "held": held, "retry_counted": retry_counted}
            fields = merged_fields(impls, hook, kwargs, self.log)
            out.append([x for kv in fields.items() for x in kv])
        return out

    def process_info(self) -> dict[str, str]:
        """What plugins tell the journal about this process (``lbs_process_info``, merged as
        :func:`merged_fields` does)."""
        impls = self.pm.hook.lbs_process_info.get_hookimpls()
        kwargs = {"client": self.owner}
        return merged_fields(impls, "lbs_process_info", kwargs, self.log) if impls else {}

    def notify(self, hook: str, /, **kwargs: Any) -> None:
        """Call every implementation of a 1:N hook, each on its own (see the class docstring)."""
        impls = getattr(self.pm.hook, hook).get_hookimpls()
        if not impls:
            return  # the common case on the hot path: nobody listens
        kwargs["client"] = self.owner
        if self._trace:
            self.log.debug(
                "hook %s(%s) -> %s", hook, ", ".join(kwargs), [i.plugin_name for i in impls]
            )
        call_each(impls, hook, kwargs, self.log)

    def metric(self, name: str, value: float, **labels: str) -> None:
        """Record one metric event (``name`` from :data:`lbs.metrics.METRICS`) and tell ``lbs_metric``.

        ``labels`` are the metric's own (:attr:`lbs.metrics.Metric.labels`; one
        missing counts as ``""``); ``service`` and ``consumer`` are added for
        the hook.
        """
        m = METRICS[name]
        kind = m.kind
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = {}
        key = tuple([labels.get(label, "") for label in m.labels]) if m.labels else ()
        if kind == "counter":
            self.counts[name] = self.counts.get(name, 0) + value
            sums = cast("dict[tuple[str, ...], float]", series)
            sums[key] = sums.get(key, 0) + value
        elif kind == "gauge":
            self.counts[name] = value
            series[key] = value
        else:
            self.counts[name] = value
            buckets = cast("dict[tuple[str, ...], Histogram]", series)
            histogram = buckets.get(key)
            if histogram is None:
                histogram = buckets[key] = self._histogram()
            histogram.observe(value)
        if self.listening("lbs_metric"):
            self.notify(
                "lbs_metric", name=name, kind=kind, value=value, labels={**self.labels, **labels}
            )
