"""A fake Redis at the socket, under lbs's real :class:`lbs._redis.wire.Wire`, for unit tests of
the consumer's activities (Finisher, Requeue, Runner, KeyedRunner) without a server.

Where it sits. An activity reaches Redis through ``state.link`` (a real
:class:`lbs._consumer.state.Link`), whose wires write a core ``CommandBatch`` to a redis-py
connection and read the replies with the core's ``RespReader``. :class:`FakeRedis` stands in for
the ``redis.asyncio.Redis`` the Link is built on: its ``connection_pool`` hands out
:class:`FakeConnection` objects whose writer parses the RESP commands written to it and whose
reader is fed the RESP replies, so the Wire's own handling (NOSCRIPT reload, LOADING wait,
retry on a fresh connection, the ``expect``-ed entry shapes) runs as it does in production.
``script_load`` (what the Wire calls after a NOSCRIPT) and ``pipeline`` (``Requeue.pardon``)
are the only redis-py calls made on the client itself.

What it answers, and from where. A small keyspace (:attr:`FakeRedis.strings` for the consumers'
leases, Go-style locks and name holders, :attr:`streams`, :attr:`hashes`, :attr:`zsets`,
:attr:`sets`, the group's :attr:`pending` entries and their :attr:`deliveries`) and one handler
per command or script, each answering with the reply shape of the script's header
(``src/lbs/_redis/lua/<name>.lua``, "Output") and the decisions its code makes, in its order. An
entry is held while it is pending to a consumer whose lease (``{<service>-input}:lease:<id>``)
holds the value it was read under: :class:`Harness` takes its consumer's lease at start, as
``lbs.Client`` does, and a test takes it away by deleting (or overwriting) that key.

* ``done-n``: the lease first (gone, or holding another value than the call's: ``"3"`` for
  every entry, nothing written); then per entry 1 (was pending, to anyone: acked and deleted) or 3 (not
  pending; 4 when ARGV[3] says it is a retry); beside a Go fleet 5 (pending to another consumer,
  or its Go-style lock holds another name) and our Go-style locks deleted; a released name's
  holder key deleted. Not modelled (an error reply): a name with waiters to put back.
* ``requeue-6``: per entry, the modes ``owned``/``restart`` (our lease holds ARGV[3], pending to us),
  ``absent`` (the holder's lease does not exist), ``any``; ``{0, "lock"}``, ``{0, "go lock"}``,
  ``{0, "acked"}``, ``{-1, "trimmed"}``, ``{-2, "LBSKEY ..."}`` (dead-letter or parking key of
  another type), ``{1, new id, lbs-input, retries}``, ``{2, dlq id, ...}``, ``{3, "", ...}`` (no
  dead-letter stream), ``{4, parked id, ..., delay}``; the retry count with the deaths carried
  in the delivery count (:attr:`FakeRedis.deliveries`) and the copy's ``<prefix>deaths``, the
  pardons taken back, the holder's queued set, the fields set on the copy, oversized copies, the
  Go-style locks, names released, the acks and deletes at the call's end. Not modelled (an error
  reply): mode ``absent``'s idle check beside a Go fleet, a name with waiters to put back.
* ``fetch-1``: ``{1, tries, pos, fails, unblamed, until}``, ``{2}`` (the lease does not hold
  the hold's nonce), ``{3, holder}`` (pending to a consumer whose lease exists), ``{4, what}``,
  with the dead holder's failed hold as the script counts it (none for one whose ``idle:<token>``
  says it kept the key drained), the holder's ``who``; not modelled: the ACL.
* ``commit-1``: ``{1, fails, unblamed, until[, messages]}``, ``{2}``, ``{5}``, ``{6, id}``,
  ``{7, why}`` (an effect stream of another type), with the script's two passes (every check
  before the first write), modes (go, last:n, stay:n, yield, skip, fail:ms:blame:last:n) and
  failure isolation; ``idle:<token>`` set by a stay that finds the key drained, deleted otherwise;
  effects are XADDed, the id floor raised; not modelled: the ACL.
* the Lua-free done (Redis >= 8.4, the harness's version): ``XACKDEL`` (1 acked and deleted, -1
  not pending) and ``DELEX key IFEQ value`` (1, 0, or an error off strings); ``release-1`` but a
  name with waiters.
* ``XRANGE key - + COUNT n``: a stream's first n entries (what KeyedRunner sends behind
  fetch-1 and commit-1, and after ``HDEL <state> idle:<token>`` for a lingering key woken).
* the pipeline ``Requeue.pardon`` sends: ``ZADD``, ``ZREMRANGEBYSCORE``, ``ZREMRANGEBYRANK``
  (run in order; its MULTI/EXEC is not modelled).

Anything else is an error reply naming the command, so a test that sends something new fails
loudly: add a ``_cmd_<name>`` or ``_script_<name>`` method (and a line above).

Telling it to fail (:meth:`FakeRedis.fail`, per command or script name, for the next N of them):
``"drop"`` (the connection closes before the command runs), ``"lose"`` (it runs, the connection
closes before its reply), ``"noscript"`` (the script cache is flushed first, as a restart does:
every EVALSHA answers NOSCRIPT until the Wire loads the scripts again), ``"loading"`` (a LOADING
reply), or any other string, sent as an error reply. :meth:`FakeRedis.hold` keeps a command's
reply back until the test releases it (a round trip in flight). Everything sent is recorded in
:attr:`FakeRedis.sent` as :class:`Call` objects.

Also here: :class:`Harness`, one consumer's ``ClientState`` built the way ``lbs.Client``
builds it (Names, Hooks with a recording plugin, ConsumerLog, Link), on a FakeRedis.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from _lbscore import Held, encode_input
from lbs import hookimpl
from lbs._consumer.state import ClientState, ConsumerLog, Link, Names
from lbs._redis import scripts
from lbs._waits import within
from lbs.config import Config
from lbs.plugins import Hooks, make_plugin_manager

__all__ = ["Call", "FakeRedis", "Gate", "Harness", "Recorder", "eventually"]

#: The bounded wait of every helper here (seconds): far above what a step takes, so only a hang reaches it.
WAIT = 5.0
_BY_SHA = {s.sha: s.name for s in scripts.SCRIPTS}
_NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."
_LOADING = "LOADING Redis is loading the dataset in memory"


@dataclass
class Requeued:
    """One entry of a requeue-6.lua call: the call's KEYS, packed options (a list) and per-call ARGV,
    then the entry's own."""

    keys: list[str]
    options: list[Any]
    mode: str
    value: str
    increment: str
    force: str
    traceback: str
    first_ms: str
    max_ms: str
    entry_id: str
    reason: str
    jitter: str
    name: str
    fields: list[str]


class Err(str):
    """An error reply (sent as ``-<text>``)."""


@dataclass
class Call:
    """One command as Redis received it: ``name`` is the script's (``"done-n"``) for an EVALSHA,
    else the command's, upper case; ``keys`` and ``args`` decoded as UTF-8 (a script's KEYS and
    ARGV; a plain command has its arguments in ``args``)."""

    name: str
    keys: list[str]
    args: list[str]


class Gate:
    """A command's reply held back (:meth:`FakeRedis.hold`) until :meth:`release`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrived = asyncio.Event()
        self.released = asyncio.Event()

    def release(self) -> None:
        self.released.set()


async def eventually(check: Callable[[], Any], what: str = "", timeout: float = WAIT) -> None:
    """Wait (bounded) until ``check()`` is true, yielding to the loop between looks."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"not within {timeout}s: {what or check}")
        await asyncio.sleep(0.001)


# ---------------------------------------------------------------- RESP ---


def _parse_commands(buf: bytearray) -> list[list[bytes]]:
    """The complete RESP commands (arrays of bulk strings) at the start of ``buf``, consumed."""
    out: list[list[bytes]] = []
    pos = 0
    while pos < len(buf):
        end = buf.find(b"\r\n", pos)
        if end < 0:
            break
        assert buf[pos : pos + 1] == b"*", bytes(buf[pos : pos + 20])
        count, p, args = int(buf[pos + 1 : end]), end + 2, []
        for _ in range(count):
            end = buf.find(b"\r\n", p)
            if end < 0:
                break
            size = int(buf[p + 1 : end])
            if end + 2 + size + 2 > len(buf):
                break
            args.append(bytes(buf[end + 2 : end + 2 + size]))
            p = end + 2 + size + 2
        if len(args) < count:
            break
        out.append(args)
        pos = p
    del buf[:pos]
    return out


def encode(reply: Any) -> bytes:
    """A reply in RESP2: int, str/bytes (bulk), None (nil), list (array), :class:`Err`."""
    if isinstance(reply, Err):
        return b"-" + reply.encode() + b"\r\n"
    if isinstance(reply, bool):
        return b":%d\r\n" % int(reply)
    if isinstance(reply, int):
        return b":%d\r\n" % reply
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, str):
        reply = reply.encode()
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    if isinstance(reply, (list, tuple)):
        return b"*%d\r\n" % len(reply) + b"".join(encode(r) for r in reply)
    raise TypeError(f"cannot encode {reply!r}")


# ------------------------------------------------------- the connection ---


class _Transport:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn

    def abort(self) -> None:  # the Wire's watchdog
        self.conn.hang_up()


class _Writer:
    def __init__(self, conn: FakeConnection) -> None:
        self.conn = conn
        self.closed = False
        self.transport = _Transport(conn)

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.conn.received(data)

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return self.closed


class FakeConnection:
    """What the Wire uses of a redis-py connection: ``connect``, ``disconnect``, ``is_connected``,
    and the stream pair ``_reader`` (fed the replies) and ``_writer`` (parses the commands)."""

    def __init__(self, server: FakeRedis) -> None:
        self.server = server
        self.is_connected = False
        self._reader: asyncio.StreamReader | None = None
        self._writer: _Writer | None = None
        self._buf = bytearray()
        self._inbox: deque[list[bytes]] = deque()
        self._held = False

    async def connect(self) -> None:
        self.server.connects += 1
        self._reader = asyncio.StreamReader()
        self._writer = _Writer(self)
        self._buf.clear()
        self._inbox.clear()
        self._held = False
        self.is_connected = True

    async def disconnect(self) -> None:
        self.hang_up()

    def hang_up(self) -> None:
        """The connection closes: what was not answered never will be."""
        self.is_connected = False
        if self._writer is not None:
            self._writer.closed = True
        if self._reader is not None and not self._reader.at_eof():
            self._reader.feed_eof()
        self._inbox.clear()

    def received(self, data: bytes) -> None:
        self._buf += data
        self._inbox.extend(_parse_commands(self._buf))
        self._pump()

    def _pump(self) -> None:
        while self._inbox and not self._held and self.is_connected:
            raw = self._inbox.popleft()
            call = self.server.record(raw)
            fault = self.server.fault_for(call)
            gate = None if fault is not None else self.server.gate_for(call)
            if gate is not None:
                self._held = True
                gate.arrived.set()
                task = asyncio.ensure_future(self._after(gate, raw, call))
                self.server.tasks.add(task)
                task.add_done_callback(self.server.tasks.discard)
                return
            self._run(raw, call, fault)

    async def _after(self, gate: Gate, raw: list[bytes], call: Call) -> None:
        reader = self._reader
        await gate.released.wait()
        self._held = False
        if self.is_connected and self._reader is reader:
            self._run(raw, call, None)
            self._pump()

    def _run(self, raw: list[bytes], call: Call, fault: str | None) -> None:
        if fault == "drop":
            self.hang_up()
            return
        if fault == "noscript":
            self.server.loaded.clear()
            fault = None
        reply: Any
        if fault == "loading":
            reply = Err(_LOADING)
        elif fault is not None and fault != "lose":
            reply = Err(fault)
        else:
            reply = self.server.execute(raw, call)
        if fault == "lose":
            self.hang_up()
            return
        assert self._reader is not None
        self._reader.feed_data(encode(reply))


class _Pool:
    def __init__(self, server: FakeRedis) -> None:
        self.server = server
        self.idle: list[FakeConnection] = []

    async def get_connection(self, *args: Any, **kwargs: Any) -> FakeConnection:
        return self.idle.pop() if self.idle else FakeConnection(self.server)

    async def release(self, conn: FakeConnection) -> None:
        self.idle.append(conn)


class _Pipeline:
    """``redis.asyncio`` pipeline as ``Requeue.pardon`` uses it (zadd, zremrangebyscore, zremrangebyrank)."""

    def __init__(self, server: FakeRedis) -> None:
        self.server = server
        self.queued: list[list[str]] = []

    def zadd(self, key: str, mapping: Mapping[str, float]) -> None:
        self.queued.append(["ZADD", key, *(x for m, s in mapping.items() for x in (str(s), m))])

    def zremrangebyscore(self, key: str, low: Any, high: Any) -> None:
        self.queued.append(["ZREMRANGEBYSCORE", key, str(low), str(high)])

    def zremrangebyrank(self, key: str, start: int, stop: int) -> None:
        self.queued.append(["ZREMRANGEBYRANK", key, str(start), str(stop)])

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        out = []
        for cmd in self.queued:
            raw = [c.encode() for c in cmd]
            call = self.server.record(raw)
            fault = self.server.fault_for(call)
            if fault in ("drop", "lose"):
                raise RedisConnectionError("connection closed by the server")
            reply = Err(fault) if fault else self.server.execute(raw, call)
            if isinstance(reply, Err):
                if raise_on_error:
                    raise ResponseError(str(reply))
                reply = ResponseError(str(reply))
            out.append(reply)
        return out

    async def reset(self) -> None:
        self.queued = []


# --------------------------------------------------------------- Redis ---


class FakeRedis:
    """The fake server and the ``redis.asyncio.Redis`` a :class:`Link` is built on (module docstring)."""

    def __init__(self) -> None:
        self.connection_pool = _Pool(self)
        #: String keys (leases, Go-style locks, name holders): key -> value.
        self.strings: dict[str, str] = {}
        #: Streams: key -> [(id, [field, value, ...]), ...], oldest first.
        self.streams: dict[str, list[tuple[str, list[str]]]] = {}
        self.hashes: dict[str, dict[str, str]] = {}
        self.zsets: dict[str, dict[str, float]] = {}
        #: Sets (the consumers' queued sets): key -> members.
        self.sets: dict[str, set[str]] = {}
        #: The group's pending entries of the LBS: entry id -> consumer.
        self.pending: dict[str, str] = {}
        #: Their delivery counts (XPENDING's fourth field), where not 1.
        self.deliveries: dict[str, int] = {}
        #: Every command received, in order.
        self.sent: list[Call] = []
        #: The SHAs in the script cache (all at first; see fail(..., "noscript")).
        self.loaded: set[str] = set(_BY_SHA)
        #: SCRIPT LOADs (script names), in order.
        self.script_loads: list[str] = []
        self.connects = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self._faults: dict[str, deque[str]] = {}
        self._gates: dict[str, deque[Gate]] = {}
        self._ms = 1_700_000_000_000

    # -- telling it what to do ------------------------------------------------

    def fail(self, name: str, kind: str, times: int = 1) -> None:
        """The next ``times`` commands named ``name`` (a script's name or a command) fail with ``kind``."""
        self._faults.setdefault(name, deque()).extend([kind] * times)

    def hold(self, name: str) -> Gate:
        """The next command named ``name`` (that no :meth:`fail` fault is armed for) is received but not run or
        answered until the gate is released."""
        gate = Gate(name)
        self._gates.setdefault(name, deque()).append(gate)
        return gate

    def release_all(self) -> None:
        for gates in self._gates.values():
            for gate in gates:
                gate.release()

    async def close(self) -> None:
        """End what holds a reply back (a test's teardown)."""
        self.release_all()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks)

    # -- what tests read --------------------------------------------------------

    def calls(self, name: str) -> list[Call]:
        return [c for c in self.sent if c.name == name]

    def requeued(self) -> list[Requeued]:
        """Every entry sent in a requeue-6.lua call, in order, read as the script reads its ARGV."""
        out = []
        for c in self.calls("requeue-6"):
            a, at = c.args, 8
            while at + 4 < len(a):
                n = int(a[at + 4])
                e = a[at : at + 5 + 2 * n]
                out.append(Requeued(c.keys, json.loads(a[0]), *a[1:8], *e[:4], e[5:]))
                at += 5 + 2 * n
        return out

    def new_id(self) -> str:
        self._ms += 1
        return f"{self._ms}-0"

    def add(self, key: str, fields: Mapping[str, Any] | Iterable[Any], entry_id: str = "") -> str:
        """XADD ``fields`` (a mapping or a flat list) to stream ``key``; its id."""
        flat = (
            [str(x) for kv in fields.items() for x in kv]
            if isinstance(fields, Mapping)
            else [x if isinstance(x, str) else str(x) for x in fields]
        )
        entry_id = entry_id or self.new_id()
        self.streams.setdefault(key, []).append((entry_id, flat))
        return entry_id

    def entry(self, key: str, entry_id: str) -> dict[str, str] | None:
        for i, fields in self.streams.get(key, []):
            if i == entry_id:
                return dict(zip(fields[::2], fields[1::2]))
        return None

    def type_of(self, key: str) -> str:
        for kind, space in (
            ("string", self.strings),
            ("stream", self.streams),
            ("hash", self.hashes),
            ("zset", self.zsets),
            ("set", self.sets),
        ):
            if key in space:
                return kind
        return "none"

    # -- the server side ----------------------------------------------------------

    async def script_load(self, source: str) -> str:
        name = next(s.name for s in scripts.SCRIPTS if s.source == source)
        sha = next(s.sha for s in scripts.SCRIPTS if s.source == source)
        self.script_loads.append(name)
        self.loaded.add(sha)
        return sha

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self)

    async def aclose(self) -> None:
        return None

    def record(self, raw: list[bytes]) -> Call:
        words = [w.decode("utf-8", "replace") for w in raw]
        command = words[0].upper()
        if command == "EVALSHA":
            n = int(words[2])
            call = Call(_BY_SHA.get(words[1], "EVALSHA"), words[3 : 3 + n], words[3 + n :])
        else:
            call = Call(command, [], words[1:])
        self.sent.append(call)
        return call

    def gate_for(self, call: Call) -> Gate | None:
        gates = self._gates.get(call.name)
        return gates.popleft() if gates else None

    def fault_for(self, call: Call) -> str | None:
        faults = self._faults.get(call.name)
        return faults.popleft() if faults else None

    def execute(self, raw: list[bytes], call: Call) -> Any:
        if raw[0].upper() == b"EVALSHA":
            if raw[1].decode() not in self.loaded:
                return Err(_NOSCRIPT)
            handler = getattr(self, "_script_" + call.name.replace("-", "_"), None)
        else:
            handler = getattr(self, "_cmd_" + call.name.lower(), None)
        if handler is None:
            return Err(f"ERR the fake wire does not model {call.name}")
        return handler(call.keys, call.args)

    def _get(self, key: str) -> str | None:
        """GET through pcall, as the scripts read a lease: None for a key absent or of another type."""
        return self.strings.get(key)

    def _fields(self, key: str, entry_id: str) -> list[str] | None:
        """XRANGE key id id: the entry's flat field list, or None."""
        for i, fields in self.streams.get(key, []):
            if i == entry_id:
                return list(fields)
        return None

    def _xack(self, entry_id: str) -> bool:
        """XACK of an LBS entry: whether it was pending."""
        self.deliveries.pop(entry_id, None)
        return self.pending.pop(entry_id, None) is not None

    def _zrem(self, key: str, member: str) -> None:
        """ZREM: a sorted set left empty is gone, as in Redis."""
        zset = self.zsets.get(key)
        if zset is not None:
            zset.pop(member, None)
            if not zset:
                del self.zsets[key]

    def _xdel(self, stream: str, entry_id: str) -> None:
        self.streams[stream] = [e for e in self.streams.get(stream, []) if e[0] != entry_id]

    def _ack(self, entry_id: str, stream: str) -> bool:
        """XACK + XDEL of what it acked (or XACKDEL): whether it was pending."""
        if not self._xack(entry_id):
            return False
        self._xdel(stream, entry_id)
        return True

    def _misfit(self, key: str, want: str, what: str) -> str | None:
        kind = self.type_of(key)
        return None if kind in ("none", want) else f"LBSKEY {key} holds a {kind}, not {what}"

    # -- plain commands -------------------------------------------------------------

    def _cmd_xrange(self, keys: list[str], args: list[str]) -> Any:
        key, low, high = args[0], args[1], args[2]
        assert (low, high) == ("-", "+"), "the fake wire models XRANGE key - + [COUNT n]"
        if self.type_of(key) not in ("none", "stream"):
            return Err("WRONGTYPE Operation against a key holding the wrong kind of value")
        count = int(args[4]) if len(args) > 4 else None
        return [[i, f] for i, f in self.streams.get(key, [])[:count]]

    def _cmd_hdel(self, keys: list[str], args: list[str]) -> Any:
        key = args[0]
        if self.type_of(key) not in ("none", "hash"):
            return Err("WRONGTYPE Operation against a key holding the wrong kind of value")
        h = self.hashes.get(key, {})
        return sum(h.pop(f, None) is not None for f in args[1:])

    def _cmd_zadd(self, keys: list[str], args: list[str]) -> Any:
        key = args[0]
        if self.type_of(key) not in ("none", "zset"):
            return Err("WRONGTYPE Operation against a key holding the wrong kind of value")
        zset = self.zsets.setdefault(key, {})
        pairs = list(zip(args[1::2], args[2::2]))
        added = sum(1 for _, m in pairs if m not in zset)
        zset.update((m, float(s)) for s, m in pairs)
        return added

    def _cmd_zremrangebyscore(self, keys: list[str], args: list[str]) -> Any:
        zset = self.zsets.get(args[0], {})
        low, high = (-math.inf if a == "-inf" else float(a) for a in args[1:3])
        gone = [m for m, s in zset.items() if low <= s <= high]
        for m in gone:
            self._zrem(args[0], m)
        return len(gone)

    def _cmd_zremrangebyrank(self, keys: list[str], args: list[str]) -> Any:
        zset = self.zsets.get(args[0], {})
        ranked = sorted(zset, key=lambda m: zset[m])
        start, stop = int(args[1]), int(args[2])
        start = max(0, start + len(ranked) if start < 0 else start)
        stop = stop + len(ranked) if stop < 0 else stop
        gone = ranked[start : stop + 1]
        for m in gone:
            self._zrem(args[0], m)
        return len(gone)

    def _cmd_xackdel(self, keys: list[str], args: list[str]) -> Any:
        """XACKDEL key group IDS n id...: 1 per id acked (and deleted), -1 per id not pending."""
        stream, n = args[0], int(args[3])
        return [1 if self._ack(entry_id, stream) else -1 for entry_id in args[4 : 4 + n]]

    def _cmd_delex(self, keys: list[str], args: list[str]) -> Any:
        """DELEX key IFEQ value: 1 when the key held value (deleted), else 0; WRONGTYPE off strings."""
        key, value = args[0], args[2]
        if self.type_of(key) not in ("none", "string"):
            return Err("ERR Key should be of string type if conditions are specified")
        if self.strings.get(key) != value:
            return 0
        del self.strings[key]
        return 1

    def _script_release_1(self, keys: list[str], args: list[str]) -> Any:
        """release-1.lua: a holder key holding the id is deleted, any other value left alone (a name
        with waiters to put back is not modelled)."""
        prefix = args[0]
        for name, entry_id in zip(args[1::2], args[2::2]):
            key = f"{prefix}name:{name}"
            if self.strings.get(key) == entry_id + "+":
                return Err("ERR the fake wire does not model a name's waiters (release-1)")
            if self.strings.get(key) == entry_id:
                del self.strings[key]
        return 0

    # -- done-n.lua ------------------------------------------------------------------

    def _script_done_n(self, keys: list[str], args: list[str]) -> Any:
        go = len(args) >= 7 and args[6] == "1"
        count, per = len(args) - 7, 3 if go else 2
        if len(keys) != 2 or count < 0 or count % per:
            return Err(
                "ERR lbs done-n: expected 2 keys and 2n + 7 (3n + 7 beside a Go fleet) arguments, "
                f"got {len(keys)} keys and {len(args)} arguments"
            )
        n = count // per
        lbs_key, retry, prefix, me = keys[0], args[2] == "1", args[3], args[4]
        ids, names, go_keys = args[7 : 7 + n], args[7 + n : 7 + 2 * n], args[7 + 2 * n :]
        if self._get(keys[1]) != args[5]:
            return "3" * n  # not under the lease it was read under: nothing is ours
        out: list[int | None] = [None] * n
        go_dels = []
        for i, entry_id in enumerate(ids):
            if go:
                # GET through pcall: a key of another type is an error table, someone else's.
                kind, g = self.type_of(go_keys[i]), self.strings.get(go_keys[i])
                holder = self.pending.get(entry_id)
                if (kind not in ("none", "string") or (g is not None and g != me)) or (
                    holder is not None and holder != me
                ):
                    out[i] = 5
                elif g == me:
                    go_dels.append(go_keys[i])
        # Names: checked before the first write (a name with waiters is not modelled).
        waiters = [
            i
            for i, entry_id in enumerate(ids)
            if prefix
            and out[i] is None
            and entry_id in self.pending
            and names[i]
            and self.strings.get(names[i]) == entry_id + "+"
        ]
        if waiters:
            return Err("ERR the fake wire does not model a name's waiters (done-n)")
        for key in go_dels:
            self.strings.pop(key, None)
        lost = 4 if retry else 3
        for i, entry_id in enumerate(ids):
            if out[i] is None:
                out[i] = 1 if self._ack(entry_id, lbs_key) else lost
        if prefix:
            for i, entry_id in enumerate(ids):
                # MGET: a holder key of another type reads as nil and is left alone.
                if out[i] == 1 and names[i] and self.strings.get(names[i]) == entry_id:
                    del self.strings[names[i]]
        return "".join(map(str, out))  # one digit per entry, as the script replies

    # -- requeue-6.lua --------------------------------------------------------------

    def _script_requeue_6(self, keys: list[str], args: list[str]) -> Any:
        """requeue-6.lua: the entries in their order, each step by step (its header's "Order"); the acks
        and deletes of the call at its end."""
        o = json.loads(args[0])
        mode, value, me = args[1], args[2], o[4]
        entries, at = [], 8
        while at < len(args):
            n = _lua_number(args[at + 4]) if at + 4 < len(args) else None
            if n is None or n < 0 or at + 4 + 2 * n >= len(args):
                return Err(f"ERR lbs requeue-6: entry {len(entries) + 1} is cut short")
            entries.append(args[at : at + 5 + 2 * int(n)])
            at += 5 + 2 * int(n)
        # 1. Our lease (modes "owned", "restart"), once: GET through pcall, another type is not ours.
        ours = mode in ("owned", "restart")
        lease_ok = not ours or self._get(keys[2] + me) == value
        acks: list[str] = []
        dels: list[str] = []
        replies = [
            self._requeue_one(keys, o, args, e, acks, dels) if lease_ok else [0, "lock"]
            for e in entries
        ]
        failed = next((r for r in replies if isinstance(r, Err)), None)
        if failed is not None:
            return failed  # (what the fake does not model fails the call)
        for entry_id in acks:
            self._xack(entry_id)
        for entry_id in dels:
            self._xdel(keys[0], entry_id)
        return replies

    def _requeue_one(
        self,
        keys: list[str],
        o: list[Any],
        args: list[str],
        e: list[str],
        acks: list[str],
        dels: list[str],
    ) -> Any:
        lbs_key, dlq, leases, parked, due = keys[:5]
        pardons = keys[5] if len(keys) > 5 else None
        mode, me, go_sep = args[1], o[4], o[7]
        entry_id, reason, jitter, name_arg = e[0], e[1], e[2], e[3]
        setting = dict(zip(e[5::2], e[6::2]))
        go_lock = mode == "owned" and go_sep and name_arg and name_arg + go_sep + entry_id
        if go_lock:
            kind = self.type_of(go_lock)
            if kind not in ("none", "string") or (kind == "string" and self.strings[go_lock] != me):
                return [0, "go lock"]
            if kind == "none":
                go_lock = ""

        # 2. Still pending, and to whom?
        holder = self.pending.get(entry_id)
        if holder is None or entry_id in acks:
            return [0, "acked"]
        if mode in ("owned", "restart") and holder != me:
            return [0, "lock"]
        if mode == "absent" and self.type_of(leases + holder) != "none":
            return [0, "lock"]
        if mode == "absent" and go_sep and o[10]:
            return Err("ERR the fake wire does not model requeue-6's idle check beside a Go fleet")
        qkey = o[8] + holder if o[8] else ""
        queued = bool(qkey) and self.type_of(qkey) == "set" and entry_id in self.sets[qkey]

        def done_with(delete: bool) -> None:
            acks.append(entry_id)
            if delete:
                dels.append(entry_id)
            if go_lock:
                self.strings.pop(go_lock, None)
            if queued:
                self.sets[qkey].discard(entry_id)
                if not self.sets[qkey]:
                    del self.sets[qkey]

        # 3. The entry.
        fields = self._fields(lbs_key, entry_id)
        if fields is None:
            done_with(False)
            return [-1, "trimmed"]
        increment = _lua_number(args[3]) or 0
        died = mode in ("absent", "restart") and increment > 0
        if died and queued:
            increment, died = 0, False
        name = _name_of(fields)
        # (A name "" is a name, as in Lua.)
        if (
            mode == "absent"
            and go_sep
            and name is not None
            and self.type_of(name + go_sep + entry_id) != "none"
        ):
            return [0, "go lock"]
        holder_key = o[9] + "name:" + name if name is not None and o[9] else ""
        if holder_key and self.strings.get(holder_key) == entry_id + "+":
            return Err("ERR the fake wire does not model a name's waiters (requeue-6)")

        # 4. The copy and its target.
        retry_field, original_field, fp = o[2], o[3], o[6]
        deaths_field = fp + "deaths"
        out: list[str] = []
        retries: float = 0
        original, lbs_input, keyed, deaths = entry_id, None, None, None
        for k, v in zip(fields[::2], fields[1::2]):
            if k == "lbs-input":
                lbs_input = v
            if k == "lbs-keyed":
                keyed = v
            if k == retry_field:
                retries = _lua_number(v) or 0
            elif k == original_field:
                original = v
            elif k == deaths_field:
                deaths = v
            elif k not in setting:
                out += [k, v]
        before = min(max(self.deliveries.get(entry_id, 1) - 1, 0), 32)
        retries += before
        counted = (deaths.split() if deaths else []) + [entry_id] * before
        kept: list[str] = []
        used: list[str] = []
        pardoned = (
            self.zsets.get(pardons, {}) if pardons and self.type_of(pardons) == "zset" else {}
        )
        for d in counted:
            if d not in used and d in pardoned:
                retries = max(retries - 1, 0)
                used.append(d)
            else:
                kept.append(d)
        if died:
            kept.append(entry_id)
        kept = kept[-32:]
        retries += increment
        trace = args[5]
        n_set = len(e[5:]) // 2
        oversized = len(out) + 10 + 2 * n_set + (2 if kept else 0) + (2 if trace else 0) > 7000
        if oversized:
            out = ["lbs-input", lbs_input] if lbs_input is not None else []
        else:
            out += e[5:]
        out += [retry_field, _lua_string(retries), original_field, original]
        if kept and not oversized:
            out += [deaths_field, " ".join(kept)]
        most = o[1]
        dead = oversized or args[4] == "1" or (most >= 0 and retries > most and keyed is None)
        if oversized:
            why = (
                f"entry has {len(fields) // 2} fields, too many to copy; kept in {lbs_key} as "
                f"{entry_id}"
            )
            reason = f"{why}; {reason}" if reason else why
        delay = 0
        first = _lua_number(args[6]) or 0
        if not dead and first > 0:
            longest = min(first * 2 ** max(retries - 1, 0), _lua_number(args[7]) or 0)
            delay = math.floor(longest * (_lua_number(jitter) or 0))
        bad = None
        if dead and o[5] == 1:
            bad = self._misfit(dlq, "stream", "a stream")
        elif delay > 0:
            bad = self._misfit(parked, "stream", "a stream") or self._misfit(
                due, "zset", "the due index"
            )
        if bad:
            return [-2, bad]

        # 5. Writes: add, release; the ack and delete at the call's end.
        if dead and o[5] == 1:
            out += [fp + "reason", reason, fp + "consumer", me, fp + "failed_id", entry_id]
            if trace:
                out += [fp + "traceback", trace]
            code, new = 2, self.add(dlq, out)
        elif dead:
            code, new = 3, ""
        elif delay > 0:
            code, new = 4, self.add(parked, out)
            self.zsets.setdefault(due, {})[new] = int(new.split("-")[0]) + delay
        else:
            code, new = 1, self.add(lbs_key, out)
        done_with(not oversized)
        for d in used:
            self._zrem(pardons, d)  # type: ignore[arg-type]
        if holder_key and self.strings.get(holder_key) == entry_id:
            del self.strings[holder_key]
        reply = [code, new, lbs_input or "", int(retries)]
        return [*reply, delay] if code == 4 else reply

    # -- fetch-1.lua and commit-1.lua (keyed) -------------------------------------

    def _keyed_state(self, leases: str, value: str, state_key: str) -> dict[str, str] | Err | None:
        """_keyed.lua's keyed_state: None when the lease does not hold the hold's nonce; an Err for a
        state of another type; else the state's fields (empty when it does not exist)."""
        m = re.fullmatch(r"[0-9]+:(.*):([^:]*)", value, re.DOTALL)
        if m is None or self._get(leases + m.group(1)) != m.group(2):
            return None
        if self.type_of(state_key) not in ("none", "hash"):
            return Err(f"{state_key} holds a {self.type_of(state_key)}")
        return self.hashes.get(state_key, {})

    def _keyed_alive(self, leases: str, entry_id: str) -> bool:
        """_keyed.lua's keyed_alive: pending to a consumer whose lease exists."""
        holder = self.pending.get(entry_id)
        return holder is not None and self.type_of(leases + holder) != "none"

    def _script_fetch_1(self, keys: list[str], args: list[str]) -> Any:
        prefix, leases = args[0], args[1]
        batch = _lua_number(args[2]) if len(args) > 2 else None
        if (len(args) - 4) % 3 or batch is None or batch < 1 or batch != int(batch):
            return Err(
                "ERR lbs fetch-1: expected 4 arguments (the batch an integer >= 1), then 3 per key"
            )
        out: list[Any] = []
        for at in range(4, len(args), 3):
            key, entry, value = args[at : at + 3]
            state_key, data = prefix + "m:" + key, prefix + "k:" + key
            got = self._keyed_state(leases, value, state_key)
            if got is None:
                out.append([2])
                continue
            if isinstance(got, Err):
                out.append([4, str(got)])
                continue
            holder, pos, tries = got.get("holder"), got.get("pos", ""), got.get("tries")
            fails, unblamed, until = got.get("fails"), got.get("unblamed"), got.get("until", "")
            m = re.fullmatch(r"([0-9]+):(.*):[^:]*", value, re.DOTALL)
            token, who = (m.group(1), m.group(2)) if m else ("", "")
            # Gone: another entry's holder (if it is not alive), or this entry's under an earlier token.
            other = holder is not None and holder != entry
            dead = other or (holder == entry and "token" in got and got["token"] != token)
            # A dead holder that kept the key drained (commit-1 "stay") ran nothing.
            idle = f"idle:{got['token']}" if dead and "token" in got else None
            if idle is not None and idle in got:
                dead = False
            else:
                idle = None
            if other and self._keyed_alive(leases, holder):  # type: ignore[arg-type]
                out.append([3, holder])
                continue
            if (
                (pos != "" and not _split_id(pos))
                or (tries is not None and not re.fullmatch("[0-9]+", tries))
                or (fails is not None and not re.fullmatch("[0-9]+", fails))
                or (unblamed is not None and not re.fullmatch("[01]", unblamed))
                or (until != "" and not _split_id(until))
            ):
                why = " holds a pos, tries, fails, unblamed or until that is not one"
                out.append([4, state_key + why])
                continue
            n_fails, n_unblamed = int(fails or 0), int(unblamed or 0)
            rest = None
            if dead:
                if self.type_of(data) not in ("none", "stream"):
                    out.append([4, f"{data} holds a {self.type_of(data)}"])
                    continue
                rest = self._after(data, pos, int(batch) if until == "" and n_fails == 0 else 1)
            n_tries = int(tries or 0) + 1
            st = self.hashes.setdefault(state_key, {})
            if rest:  # the last hold ended with its holder: a failed hold
                if until != "" or n_fails > 0 or len(rest) == 1:
                    n_fails, n_unblamed = n_fails + 1 + n_unblamed, 0
                else:
                    until, n_unblamed = rest[-1][0], 1
                st.update(fails=str(n_fails), unblamed=str(n_unblamed), until=until)
            st.update(holder=entry, token=token, who=who, reg=entry, tries=str(n_tries))
            if idle is not None:
                st.pop(idle, None)
                st.pop("lingers", None)
            out.append([1, n_tries, pos, n_fails, n_unblamed, until])
        return out

    def _after(self, data: str, pos: str, count: int) -> list[tuple[str, list[str]]]:
        return [e for e in self.streams.get(data, []) if not pos or _id_below(pos, e[0])][:count]

    def _script_commit_1(self, keys: list[str], args: list[str]) -> Any:
        prefix, leases, dlq, fp = args[0], args[1], args[4], args[5]
        max_retries, consumer = _lua_number(args[6]), args[7]
        if max_retries is None or max_retries < -1 or max_retries != int(max_retries):
            return Err("ERR lbs commit-1: max retries (ARGV[7]) must be an integer >= -1")
        # Pass 1, reads only: every argument and each key's hold; a bad argument fails the call whole.
        steps: list[tuple[_Step, dict[str, str] | None, list[Any] | None]] = []
        parking_checked = False
        checked: dict[str, str] = {}
        at = 8
        while at < len(args):
            if at + 8 >= len(args):
                return Err(f"ERR lbs commit-1: key {len(steps) + 1} has fewer than 9 arguments")
            key, entry, value, pos, mode, reg, reason, trace, count = args[at : at + 9]
            if pos != "" and not _split_id(pos):
                return Err(f"ERR lbs commit-1: position {pos} is not an entry id")
            fail = _parse_fail(mode)
            if (
                fail is None
                and mode not in ("go", "yield", "skip")
                and not re.fullmatch("(last|stay):[0-9]+", mode)
            ):
                return Err(
                    f"ERR lbs commit-1: mode {mode} is not go, last:<n>, stay:<n>, yield, skip or "
                    "fail:<ms>:<blame>:<last>:<n>"
                )
            if fail and fail.delay > 0 and not parking_checked:
                bad = self._misfit(prefix + "delayed", "stream", "a stream") or self._misfit(
                    prefix + "due", "zset", "a zset"
                )
                if bad:
                    return Err(bad)
                parking_checked = True
            e = _lua_number(count)
            if e is None or e < 0 or e != int(e):
                return Err(
                    f"ERR lbs commit-1: the effect count of key {key} is not an integer >= 0"
                )
            effects, nxt = [], at + 9
            for k in range(1, int(e) + 1):
                f = _lua_number(args[nxt + 1]) if nxt + 1 < len(args) else None
                if f is None or f < 2 or f % 2 or nxt + 2 + f > len(args):
                    return Err(f"ERR lbs commit-1: effect {k} of key {key} is malformed")
                effects.append((args[nxt], args[nxt + 2 : nxt + 2 + int(f)]))
                nxt += 2 + int(f)
            got = self._keyed_state(leases, value, prefix + "m:" + key)
            st: dict[str, str] | None = None
            if isinstance(got, dict) and got.get("holder") == entry:
                c = got.get("pos", "")
                if c == "" or _split_id(c):
                    if pos != "" and c != "" and pos != c and _id_below(pos, c):
                        return Err(
                            f"ERR lbs commit-1: position {pos} of {key} is below the committed {c}"
                        )
                    st = got
            refusal = None
            if st is not None:
                for stream, _ in effects:
                    if stream not in checked:
                        kind = self.type_of(stream)
                        ok = kind in ("none", "stream")
                        checked[stream] = "" if ok else f"{stream} holds a {kind}, not a stream"
                    if checked[stream]:
                        refusal = [7, "an effect cannot be written: " + checked[stream]]
                        break
            step = _Step(key, entry, pos, mode, reg, reason, trace, effects, value.split(":")[0])
            steps.append((step, st, refusal))
            at = nxt
        # Pass 2: writes, key by key; the entries let go are acked together at the end.
        out: list[Any] = []
        finished: list[str] = []
        floor = [-1]
        for step, st, refusal in steps:
            if st is None:
                out.append([2])
            elif refusal is not None:
                out.append(refusal)
            else:
                out.append(
                    self._commit(
                        keys[0],
                        prefix,
                        st,
                        step,
                        finished,
                        floor,
                        dlq,
                        fp,
                        int(max_retries),
                        consumer,
                    )
                )
        floor_key = prefix + "idfloor"
        if floor[0] >= 0 and self.type_of(floor_key) in ("none", "zset"):
            zset = self.zsets.setdefault(floor_key, {})
            zset["ms"] = max(zset.get("ms", floor[0]), floor[0])
        for entry in finished:
            self._ack(entry, keys[0])
        return out

    def _commit(
        self,
        lbs_key: str,
        prefix: str,
        st: dict[str, str],
        step: _Step,
        finished: list[str],
        floor: list[int],
        dlq: str,
        fp: str,
        max_retries: int,
        consumer: str,
    ) -> Any:
        """One key's step, as commit-1.lua's ``commit(i)``."""
        data, state_key = prefix + "k:" + step.key, prefix + "m:" + step.key
        position = st.get("pos", "")
        moved = step.pos != "" and step.pos != position
        if moved:
            position = step.pos
        if self.type_of(data) not in ("none", "stream"):
            return [2]
        rest = self._after(data, position, 1)
        if moved:
            for stream, fields in step.effects:
                self.add(stream, fields)

        def release() -> Any:
            if position:
                floor[0] = max(floor[0], int(position.split("-")[0]))
            self.hashes.pop(state_key, None)
            self.streams.pop(data, None)
            finished.append(step.entry)
            return [5]

        fail = _parse_fail(step.mode)
        last_n = int(step.mode[5:]) if step.mode.startswith(("last:", "stay:")) else None
        staying = step.mode.startswith("stay:") and not rest
        idle = "idle:" + step.token
        if not rest and fail is None and step.mode != "skip" and not staying:
            return release()
        was_fails = int(_lua_number(st.get("fails", "")) or 0)
        was_unblamed = int(_lua_number(st.get("unblamed", "")) or 0)
        was_until = st.get("until", "") if _split_id(st.get("until", "")) else ""
        fails, unblamed, until = was_fails, was_unblamed, was_until
        if moved:
            fails = 0
        going, count = ("last", last_n) if last_n is not None else (step.mode, 0)
        if fail and (not rest or _id_below(fail.last, rest[0][0])):
            going, count, fail = "last", fail.n, None
        if step.mode == "skip" or (fail and fail.blame):
            if fail:
                fails, unblamed = fails + 1 + unblamed, 0
            if step.mode == "skip" or (max_retries >= 0 and fails >= 1 + max_retries):
                if rest:
                    head_id, head = rest[0]
                    why = f"failed in {fails} holds; {step.reason}" if fail else step.reason
                    letter = [
                        *head,
                        fp + "reason",
                        why,
                        fp + "failed_id",
                        head_id,
                        fp + "key",
                        step.key,
                    ]
                    letter += [
                        fp + "retry_count",
                        str(max(0, fails - 1)),
                        fp + "consumer",
                        consumer,
                    ]
                    if step.trace:
                        letter += [fp + "traceback", step.trace]
                    if dlq:
                        self.add(dlq, letter)
                    position, moved, fails = head_id, True, 0
                    rest = self._after(data, position, 1)
                going, count = ("last", fail.n) if fail else ("go", 0)
            else:
                going = "park"
        elif fail:
            if until == "" or _id_below(until, fail.last):
                until = fail.last
            unblamed, going = 1, "park"
        if until and position and not _id_below(position, until):
            until, unblamed = "", 0
        if not rest and not staying:
            return release()
        registers = going in ("yield", "park")
        if moved:
            st["pos"], st["tries"] = position, "0" if registers else "1"
            self.streams[data] = [
                e for e in self.streams.get(data, []) if _id_below(position, e[0])
            ]
        # A count of 0 (or no until) is no field: HDEL where the state had one, as the script does.
        for field, now, was in (("fails", fails, was_fails), ("unblamed", unblamed, was_unblamed)):
            if now != 0:
                st[field] = str(now)
            elif was != 0:
                st.pop(field, None)
        if until:
            st["until"] = until
        elif was_until:
            st.pop("until", None)
        if registers:
            delay = fail.delay if going == "park" and fail else 0
            target = prefix + "delayed" if delay > 0 else lbs_key
            reg = self.add(target, ["lbs-input", step.registration, "lbs-keyed", "1"])
            if delay > 0:
                self.zsets.setdefault(prefix + "due", {})[reg] = self._ms + delay
            st["reg"] = reg
            for field in ("holder", "token", "who", idle, "lingers"):
                st.pop(field, None)
            finished.append(step.entry)
            return [6, reg]
        if staying:
            st[idle] = st["lingers"] = "1"
        else:
            st.pop(idle, None)
            st.pop("lingers", None)
        if going == "last":
            return [
                1,
                fails,
                unblamed,
                until,
                [[i, f] for i, f in self._after(data, position, count)],
            ]
        return [1, fails, unblamed, until]


@dataclass
class _Step:
    key: str
    entry: str
    pos: str
    mode: str
    registration: str
    reason: str
    trace: str
    effects: list[tuple[str, list[str]]]
    #: The hold's fencing token (its value's first part).
    token: str


@dataclass
class _Fail:
    delay: int
    blame: bool
    last: str
    n: int


def _parse_fail(mode: str) -> _Fail | None:
    m = re.fullmatch(r"fail:([0-9]+):([01]):([0-9]+-[0-9]+):([0-9]+)", mode)
    if m is None:
        return None
    return _Fail(int(m.group(1)), m.group(2) == "1", m.group(3), int(m.group(4)))


def _split_id(entry_id: str) -> bool:
    """_keyed.lua's split_id, as a test: whether ``entry_id`` is "<digits>-<digits>"."""
    return re.fullmatch(r"[0-9]+-[0-9]+", entry_id) is not None


_NUMBER = re.compile(r"\s*[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\s*")


def _lua_number(text: str) -> float | None:
    """Lua's ``tonumber`` of a decimal string (None where it gives nil); integral values as int."""
    if not _NUMBER.fullmatch(text):
        return None
    x = float(text)
    return int(x) if x.is_integer() else x


def _lua_string(x: float) -> str:
    """Lua 5.1's ``tostring`` of a number (``%.14g``)."""
    return format(float(x), ".14g")


_NAME_FAST = re.compile(r'\{\s*"DataStreamName"\s*:\s*"([^"\\]*)"\s*[,}]')


def _name_of(fields: list[str]) -> str | None:
    """_names.lua's name_of: the DataStreamName of an entry's first lbs-input field, or None."""
    for k, v in zip(fields[::2], fields[1::2]):
        if k == "lbs-input":
            fast = _NAME_FAST.match(v)
            if fast:
                return fast.group(1)
            try:
                doc = json.loads(v)
            except ValueError:
                return None
            name = doc.get("DataStreamName") if isinstance(doc, dict) else None
            return name if isinstance(name, str) else None
    return None


def _id_below(a: str, b: str) -> bool:
    am, _, aseq = a.partition("-")
    bm, _, bseq = b.partition("-")
    return (int(am), int(aseq)) < (int(bm), int(bseq))


# ------------------------------------------------------------- harness ---


class Recorder:
    """A plugin that records the hooks the activities call: ``events[hook]`` is a list of kwargs."""

    def __init__(self) -> None:
        self.events: dict[str, list[dict[str, Any]]] = {}
        self._heard = asyncio.Event()

    def _add(self, hook: str, **kwargs: Any) -> None:
        self.events.setdefault(hook, []).append(kwargs)
        self._heard.set()

    def of(self, hook: str) -> list[dict[str, Any]]:
        return self.events.get(hook, [])

    async def wait(self, hook: str, count: int = 1) -> list[dict[str, Any]]:
        """Until ``hook`` was called ``count`` times (bounded); its calls."""

        async def heard() -> None:
            while len(self.of(hook)) < count:
                self._heard.clear()
                await self._heard.wait()

        await within(heard(), WAIT)
        return self.of(hook)

    @hookimpl
    def lbs_lock_released(self, stream: str, entry_id: str, token: int, status: Any) -> None:
        self._add("lbs_lock_released", stream=stream, entry_id=entry_id, token=token, status=status)

    @hookimpl
    def lbs_locks_released(self, released: Any) -> None:
        self._add("lbs_locks_released", released=list(released))

    @hookimpl
    def lbs_stream_handed_back(
        self, stream: str, entry_id: str, new_entry_id: str, retry_counted: bool
    ) -> None:
        self._add(
            "lbs_stream_handed_back",
            stream=stream,
            entry_id=entry_id,
            new_entry_id=new_entry_id,
            retry_counted=retry_counted,
        )

    @hookimpl
    def lbs_stream_dead_lettered(self, entry_id: str, reason: str, dead_letter_id: str) -> None:
        self._add(
            "lbs_stream_dead_lettered",
            entry_id=entry_id,
            reason=reason,
            dead_letter_id=dead_letter_id,
        )

    @hookimpl
    def lbs_stream_expired(
        self, stream: str, entry_id: str, new_entry_id: str, retry_count: int, path: str
    ) -> None:
        self._add(
            "lbs_stream_expired",
            stream=stream,
            entry_id=entry_id,
            new_entry_id=new_entry_id,
            retry_count=retry_count,
            path=path,
        )


#: Quick retries for the activities' back-off loops (they are not what these tests wait on).
FAST = dict(read_retry_initial=0.001, read_retry_max=0.002)


class Harness:
    """One consumer's :class:`ClientState` on a :class:`FakeRedis`, built as ``lbs.Client`` builds it
    (``Names.of``, ``Hooks`` over a plugin manager holding a :class:`Recorder`, ``ConsumerLog``, a
    ``Link`` on the client), the server's version set as ``Topology.start`` would, and the consumer's
    lease taken (``{svc-input}:lease:<id>`` holding ``state.lease.value``) as ``Instance.take`` does."""

    def __init__(self, fake: FakeRedis, config: Config | None = None, service: str = "svc") -> None:
        self.fake = fake
        self.config = config if config is not None else Config(**FAST)  # type: ignore[arg-type]
        self.names = Names.of(service, "redis-consumer-unit", "0123456789ab", self.config)
        self.recorder = Recorder()
        pm = make_plugin_manager([self.recorder], load_entrypoints=False)
        self.log = ConsumerLog(logging.getLogger("lbs"), {"consumer_id": self.names.id})
        labels = {"service": service, "consumer": self.names.id}
        self.hooks = Hooks(pm, None, labels, self.log)
        self.state = ClientState(self.config, self.names, self.hooks, self.log, Link(fake), None)  # type: ignore[arg-type]
        self.state.server.version = (8, 6, 3)
        fake.strings[self.names.lease_key] = self.state.lease.value
        self._token = 100

    @property
    def metrics(self) -> Mapping[str, float]:
        return self.hooks.counts

    @property
    def lease(self) -> str | None:
        """What this consumer's lease key holds (None: gone)."""
        return self.fake.strings.get(self.names.lease_key)

    def deliver(
        self, stream: str, fields: Mapping[str, Any] | None = None, consumer: str | None = None
    ) -> str:
        """An LBS entry for ``stream``, delivered (pending) to ``consumer`` (default: this one) and not
        in any holdings; its id. Another consumer holds it while its lease, ``lease_of(consumer)``,
        exists in :attr:`FakeRedis.strings`."""
        n = self.names
        entry_id = self.fake.add(
            n.stream_key, {"lbs-input": encode_input(stream).decode(), **(fields or {})}
        )
        self.fake.pending[entry_id] = n.id if consumer is None else consumer
        return entry_id

    def lease_of(self, consumer: str) -> str:
        """Consumer ``consumer``'s lease key (in this harness's service)."""
        return self.names.lease_prefix + consumer

    def take(
        self, stream: str, fields: Mapping[str, Any] | None = None, retry_count: int = 0
    ) -> Held:
        """A stream taken as the reader takes one: delivered to us under our lease (its value
        ``<token>:<consumer id>:<lease value>``), in the holdings."""
        n = self.names
        entry_id = self.deliver(stream, fields)
        self._token += 1
        value = f"{self._token}:{n.id}:{self.state.lease.value}"
        # The core's record still computes a lock key from the table's prefix; nothing writes it.
        h = Held(
            entry_id, stream, {}, retry_count, self._token, value, n.lock_key_prefix + entry_id
        )
        self.state.holdings.table.add(h)
        return h
