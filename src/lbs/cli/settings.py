"""``lbs worker``'s settings: the :class:`lbs.Config` in layers, and the handler named ``MODULE:HANDLER``.

Layers, each over the one before (a later layer wins, field by field):

1. ``lbs.Config``'s defaults;
2. the defaults installed plugins contribute (hook ``lbs_config_defaults``);
3. the ``[lbs]`` table of the TOML file given with ``--config`` (or ``$LBS_CONFIG``);
4. the environment: ``LBS_<FIELD>`` for each Config field (``LBS_LOCK_TTL=5``);
5. the command line: ``--set FIELD=VALUE`` and the flags for common fields
   (``--lock-ttl``, ``--max-streams``, ``--max-retries``, ``--drain-timeout``,
   ``--timeout`` for ``handler_timeout``).

Text values (environment, ``--set``, and TOML strings for fields that are
not strings) are read by the field's type: numbers, ``true``/``false`` (also
``1``/``0``, ``yes``/``no``, ``on``/``off``), ``none`` for a field that may be
None, comma-separated names for ``disabled_plugins``. Whatever Config refuses
raises :class:`lbs.ConfigurationError` naming the field and where its value
came from. :class:`WorkerSettings` is what the command resolved, all one worker
process needs (the supervisor hands it to its children as JSON).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import json
import os
import re
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..client import Handler
from ..config import Config
from ..exceptions import ConfigurationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "HandlerError",
    "Layers",
    "WorkerSettings",
    "env_name",
    "load_handler",
    "resolve_config",
]

#: The Config fields, and the type of each (resolved from the annotations).
FIELDS: dict[str, Any] = typing.get_type_hints(Config)
#: The environment variables of the ``lbs`` command itself, never taken for misspelt Config fields.
COMMAND_ENV = frozenset(
    {
        "LBS_URL",
        "LBS_SERVICE",
        "LBS_CONCURRENCY",
        "LBS_PROCESSES",
        "LBS_SHARDS",
        "LBS_CONFIG",
        "LBS_LOG_LEVEL",
        "LBS_LOAD_PLUGINS",
        "LBS_TRACE_PLUGINS",
    }
)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_name(name: str) -> str:
    """The environment variable of Config field ``name``: ``LBS_<NAME>``."""
    return "LBS_" + name.upper()


@dataclass
class Layers:
    """The values set above lbs's defaults, and where each came from (for messages and the banner)."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    #: Near-misses: environment variables that look like a Config field's but are not one.
    warnings: list[str] = field(default_factory=list)

    def set(self, name: str, value: Any, source: str) -> None:
        if name not in FIELDS:
            close = difflib.get_close_matches(name, list(FIELDS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigurationError(f"{source}: Config has no field {name!r}{hint}")
        self.values[name] = value
        self.sources[name] = source

    def build(self, defaults: Mapping[str, Any] | None = None) -> Config:
        """The Config of ``defaults`` (the plugins') under these layers; errors say where a value came from."""
        merged = {**(defaults or {}), **self.values}
        try:
            return Config(**merged)
        except ConfigurationError as exc:
            message = str(exc)
            named = dict.fromkeys(w for w in re.findall(r"[a-z_]+", message) if w in merged)
            where = [f"{n} from {self.sources.get(n, 'a plugin default')}" for n in named]
            raise ConfigurationError(
                f"{message} ({'; '.join(where)})" if where else message
            ) from None


def field_type(name: str) -> tuple[Any, bool]:
    """Config field ``name``'s type without ``None``, and whether it may be None."""
    tp = FIELDS[name]
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def parse_text(name: str, text: str, source: str) -> Any:
    """Read a text value for Config field ``name`` by its type (see the module's docstring)."""
    base, optional = field_type(name)
    raw = text.strip()
    if optional and base is not str and raw.lower() in ("none", "null", ""):
        return None
    if typing.get_origin(base) is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if base is bool:
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ConfigurationError(f"{source}: Config.{name} takes true or false, got {text!r}")
    if base in (int, float):
        try:
            return base(raw)
        except ValueError:
            kind = "an integer" if base is int else "a number"
            raise ConfigurationError(
                f"{source}: Config.{name} takes {kind}, got {text!r}"
            ) from None
    return text


def from_file(layers: Layers, path: Path) -> None:
    """Add the ``[lbs]`` table of the TOML file at ``path``."""
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the config file {str(path)!r}: {exc.strerror or exc}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(
            f"the config file {str(path)!r} is not valid TOML: {exc}"
        ) from None
    table = doc.get("lbs")
    if table is None:
        stray = sorted(set(doc) & set(FIELDS))
        if stray:
            raise ConfigurationError(
                f"the config file {str(path)!r} sets {', '.join(stray)} at the top level: "
                "put lbs's settings under an [lbs] table"
            )
        return
    if not isinstance(table, dict):
        raise ConfigurationError(
            f"the config file {str(path)!r}: 'lbs' must be a table ([lbs]), "
            f"got {type(table).__name__}"
        )
    for name, value in table.items():
        source = f"{path} [lbs] {name}"
        if isinstance(value, str) and name in FIELDS and field_type(name)[0] is not str:
            value = parse_text(name, value, source)
        layers.set(name, value, source)


def from_env(layers: Layers, environ: Mapping[str, str]) -> None:
    """Add ``LBS_<FIELD>`` variables; note ``LBS_`` variables that look like a misspelt field."""
    known = {env_name(n): n for n in FIELDS}
    for key, text in sorted(environ.items()):
        if not key.startswith("LBS_"):
            continue
        name = known.get(key)
        if name is not None:
            layers.set(name, parse_text(name, text, f"environment {key}"), f"environment {key}")
        elif key not in COMMAND_ENV:
            close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.85)
            if close:
                layers.warnings.append(
                    f"environment variable {key} is not a Config field's; did you mean "
                    f"{close[0]}? (ignored)"
                )


def from_flags(layers: Layers, sets: list[str], flags: Mapping[str, tuple[str, Any]]) -> None:
    """Add ``--set FIELD=VALUE`` items, then the named flags (``{field: (flag, value or None)}``).

    A ``--set`` item without ``=``, or a field given by both, is a
    :class:`ValueError` (a usage error, not a configuration one).
    """
    from_set: set[str] = set()
    for item in sets:
        name, eq, text = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ValueError(f"--set takes FIELD=VALUE (e.g. --set lock_ttl=5), got {item!r}")
        source = f"--set {name}"
        if name not in FIELDS:
            layers.set(name, None, source)  # raises, with the nearest field's name
        layers.set(name, parse_text(name, text, source), source)
        from_set.add(name)
    for name, (flag, value) in flags.items():
        if value is None:
            continue
        if name in from_set:
            raise ValueError(f"{name} is given twice: by {flag} and by --set {name}=...")
        layers.set(name, value, flag)


def resolve_config(
    config_file: Path | None,
    environ: Mapping[str, str],
    sets: list[str],
    flags: Mapping[str, tuple[str, Any]],
) -> tuple[Config, Layers]:
    """The worker's Config from every layer, and the layers (sources, warnings).

    Raises :class:`lbs.ConfigurationError` for a value Config refuses, a
    field it does not have, or a file that cannot be read; :class:`ValueError`
    for a malformed ``--set``.
    """
    from ..plugins import make_plugin_manager, plugin_config_defaults

    layers = Layers()
    if config_file is not None:
        from_file(layers, config_file)
    from_env(layers, environ)
    from_flags(layers, sets, flags)
    alone = (
        layers.build()
    )  # the layers without the plugins' defaults first: their errors name their sources
    defaults = plugin_config_defaults(make_plugin_manager(disabled=alone.disabled_plugins))
    for name in defaults:
        layers.sources.setdefault(name, "a plugin default")
    return layers.build(defaults), layers


def changed_fields(config: Config) -> dict[str, Any]:
    """The fields of ``config`` that differ from lbs's defaults."""
    default = Config()
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(Config)
        if getattr(config, f.name) != getattr(default, f.name)
    }


# ------------------------------------------------------------- the handler ---


class HandlerError(Exception):
    """``MODULE:HANDLER`` names no usable handler; ``usage`` tells a wrong name (exit 2) from an import that raised."""

    def __init__(self, message: str, *, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


def load_handler(target: str, app_dir: str | None = None) -> Handler:
    """Import ``MODULE:HANDLER`` (``HANDLER`` may be dotted: ``module:obj.method``), check it is an async callable.

    ``app_dir`` goes first on ``sys.path`` (the current directory by default,
    as ``python -m`` would have it). Raises :class:`HandlerError`.
    """
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise HandlerError(f"expected MODULE:HANDLER (e.g. myapp.workers:handle), got {target!r}")
    path = os.path.abspath(app_dir if app_dir is not None else os.curdir)
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise HandlerError(
                f"no module named {missing!r} (looked on sys.path, which starts with {path!r}; "
                "see --app-dir)"
            ) from None
        raise HandlerError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}", usage=False
        ) from exc
    except Exception as exc:
        raise HandlerError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}", usage=False
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HandlerError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise HandlerError(
            f"{target} is not callable (a {type(obj).__name__}): lbs calls "
            "`await handler(notification)`"
        )
    if not (
        inspect.iscoroutinefunction(obj)
        # The method itself: callable() would not say whether it is a coroutine function.
        or inspect.iscoroutinefunction(getattr(obj, "__call__", None))  # noqa: B004
    ):
        raise HandlerError(
            f"{target} is not an async function: lbs calls `await handler(notification)`, "
            "so define it with `async def`"
        )
    try:
        inspect.signature(obj).bind(object())
    except TypeError:
        raise HandlerError(f"{target} must take one argument, the lbs.Notification") from None
    except ValueError:  # no signature to read (a builtin): let the call tell
        pass
    handler: Handler = obj
    return handler


@dataclass
class WorkerSettings:
    """Everything one worker process needs, resolved by the command (JSON, for the supervisor's children)."""

    target: str
    app_dir: str
    url: str
    service: str
    #: This process's consumer id (a supervisor's child: ``<consumer_base>-<slot>``).
    consumer_id: str
    consumer_base: str
    concurrency: int | None
    processes: int
    shards: int
    #: Every Config field, resolved from all layers.
    config: dict[str, Any]
    #: Where each field that is not lbs's default came from.
    sources: dict[str, str] = field(default_factory=dict)
    log_level: str = "info"
    #: ``text`` or ``json`` (``--log-format``).
    log_format: str = "text"
    banner: bool = True
    #: Run the handler with ``run_keyed()`` (it takes an lbs.KeyedBatch) rather than ``run()``.
    keyed: bool = False
    #: ``run_keyed()``'s most messages per handler call.
    batch: int = 100
    #: ``run_keyed()``'s linger: seconds a drained key stays held, woken by publish.
    linger: float = 5.0
    #: Shard counts of layouts being left (``--previous-shards``): their shards are read too.
    previous_shards: list[int] = field(default_factory=list)
    #: A supervisor's child: its slot, and the supervisor's pid (the child stops when it dies).
    slot: int | None = None
    parent_pid: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSettings:
        return cls(**json.loads(text))
