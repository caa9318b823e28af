"""Every option of the ``lbs`` data source, in one list: the modes it applies to, its default, its
meaning. Each mode's options are checked against it (a misspelt or misplaced option is an error that
names the close ones), and docs/spark.md's options table is :func:`table` (a test compares them).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import NamedTuple

from ..exceptions import ConfigurationError

__all__ = ["MODES", "OPTIONS", "Option", "check", "table"]

#: ``spark.read``, ``spark.readStream``, ``df.write``, ``df.writeStream``.
MODES = ("read", "readStream", "write", "writeStream")
_ALL, _READ, _WRITE = MODES, ("read", "readStream"), ("write", "writeStream")


class Option(NamedTuple):
    name: str
    modes: tuple[str, ...]
    default: str
    meaning: str


OPTIONS: tuple[Option, ...] = (
    Option(
        "url",
        _ALL,
        "(required)",
        "`redis://`, `rediss://` (TLS), `redis+cluster://` / `rediss+cluster://` (Redis Cluster), "
        "`redis+sentinel://` / `rediss+sentinel://` (the master a set of Sentinels names)",
    ),
    Option("cluster", _ALL, "`none`", "`oss` for Redis Cluster (or a `+cluster` URL)"),
    Option("username", _ALL, "the URL's", "ACL user, overriding the URL's"),
    Option(
        "password", _ALL, "the URL's", "password, overriding the URL's (keeps it out of the URL)"
    ),
    Option("ssl_ca_certs", _ALL, "", "redis-py's TLS setting of that name"),
    Option("ssl_certfile", _ALL, "", "redis-py's TLS setting of that name"),
    Option("ssl_keyfile", _ALL, "", "redis-py's TLS setting of that name"),
    Option("ssl_cert_reqs", _ALL, "", "redis-py's TLS setting of that name"),
    Option("ssl_check_hostname", _ALL, "", "redis-py's TLS setting of that name"),
    Option("streams", _READ, "", "the streams to read, comma-separated"),
    Option("pattern", _READ, "", "a SCAN match: every stream whose name fits"),
    Option(
        "source", _READ, "", "`lbs` (the service's LBS) or `dlq` (its dead letters), with `service`"
    ),
    Option(
        "service",
        _ALL,
        "(required to write)",
        "the service: where the sink registers the data streams; what `source` reads",
    ),
    Option(
        "splitEntries",
        ("read",),
        "none",
        "cut a longer stream into ID ranges of this many entries, each a partition (the driver "
        "reads its ids once)",
    ),
    Option(
        "maxEntriesPerPartition",
        _READ,
        "10,000",
        "a partition reads streams of one node until the next would take it past this many "
        "entries (by estimate: the stream's length, or its growth since the last trigger); a "
        "bigger stream is a partition of its own",
    ),
    Option(
        "group",
        ("readStream",),
        "(required)",
        "the query's own consumer group (its pending entries are what a restart replays)",
    ),
    Option("startingOffsets", ("readStream",), "`earliest`", "`earliest` or `latest`"),
    Option(
        "patternRefreshSeconds",
        ("readStream",),
        "60",
        "with `pattern`: SCAN for new streams at the first trigger and then at most this often "
        "(0: every trigger); a new stream waits for the next SCAN",
    ),
    Option(
        "maxEntriesPerTrigger",
        ("readStream",),
        "none",
        "entries a micro-batch reads at most, over all its streams",
    ),
    Option("streamColumn", _WRITE, "`stream`", "the column naming each row's data stream"),
    Option("register", _WRITE, "`true`", "register the data streams written in the LBS"),
    Option("registerOnly", _WRITE, "`false`", "only register the streams named, append nothing"),
    Option(
        "runTag",
        _WRITE,
        "the query's id; one per job",
        "the first part of every XADD IDMP producer id (and of a query's restart record)",
    ),
    Option("idmp", _WRITE, "`true`", "XADD IDMP on Redis >= 8.6 (`false`: plain XADD)"),
    Option(
        "idmpMaxSize",
        _WRITE,
        "the stream's (100)",
        "XCFGSET IDMP-MAXSIZE of each stream written (at most 10,000)",
    ),
    Option(
        "idmpDuration",
        _WRITE,
        "the stream's (100 s)",
        "XCFGSET IDMP-DURATION of each stream written, seconds (1-86,400)",
    ),
)

#: The options by lowercased name (Spark hands them over lowercased).
_BY_NAME = {o.name.lower(): o for o in OPTIONS}
#: What Spark itself adds to a data source's options.
_SPARKS = {"checkpointlocation", "queryname"}
#: Test hooks (not documented): raise after N rows, stop at a point of the commit.
_HOOKS = {"_failafterrows", "_pauseat"}


def check(options: Mapping[str, str], mode: str) -> None:
    """Refuse an option that no mode knows (naming the close ones) or that ``mode`` does not take."""
    for key in options:
        k = key.lower()
        if k in _SPARKS or k in _HOOKS:
            continue
        if k == "path":
            raise ConfigurationError(
                "the lbs source takes no path (load(path) / save(path)): name the streams with "
                "option 'streams', 'pattern' or 'source', the service with 'service'"
            )
        option = _BY_NAME.get(k)
        if option is None:
            close = difflib.get_close_matches(k, list(_BY_NAME), n=3, cutoff=0.6)
            hint = (
                f"; did you mean {', '.join(repr(_BY_NAME[c].name) for c in close)}?"
                if close
                else ""
            )
            raise ConfigurationError(f"unknown option {key!r} of the lbs source{hint}")
        if mode not in option.modes:
            raise ConfigurationError(
                f"option {option.name!r} applies to {', '.join(option.modes)}, not to {mode}"
            )


def table() -> str:
    """docs/spark.md's options table (markdown)."""
    lines = [
        "| option | read | readStream | write | writeStream | default | meaning |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in OPTIONS:
        marks = " | ".join("yes" if m in o.modes else "" for m in MODES)
        lines.append(f"| `{o.name}` | {marks} | {o.default} | {o.meaning} |")
    return "\n".join(lines) + "\n"
