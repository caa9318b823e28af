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

What it answers, and from where. A small keyspace (:attr:`FakeRedis.strings` for locks,
:attr:`streams`, :attr:`hashes`, :attr:`zsets`, the group's :attr:`pending` entries) and one
handler per command or script, each answering with the reply shape of the script's header
(``src/lbs/_redis/lua/<name>.lua``, "Output") and the decisions its code makes:

* ``done-n``: one digit per lock, 1 (ours: released, acked, deleted), 2 (no lock, still pending: acked),
  3 (someone else's lock, or gone and not pending), 4 (as 3 when ARGV[3] says it is a retry);
  not modelled: the Go fleet (code 5), names released.
* ``requeue-6``: ``{0, "lock"}``, ``{0, "acked"}``, ``{-1, "trimmed"}``, ``{-2, "LBSKEY ..."}``
  (dead-letter or parking key of another type), ``{1, new id, lbs-input, retries}``,
  ``{2, dlq id, ...}``, ``{3, "", ...}`` (no dead-letter stream), ``{4, parked id, ..., delay}``;
  the retry count is the entry's field plus ARGV[5]; not modelled: deaths carried from the
  delivery count, pardons, queued sets, the Go fleet, names, oversized copies.
* ``fetch-1``: ``{1, tries, pos, fails, unblamed, until}``, ``{2}``, ``{3, holder}``,
  ``{4, what}``, with the dead holder's failed hold as the script counts it.
* ``commit-1``: ``{1, fails, unblamed, until[, messages]}``, ``{2}``, ``{5}``, ``{6, id}``,
  ``{7, why}`` (an effect stream of another type), with the script's modes (go, last:n, yield,
  skip, fail:ms:blame:last:n) and failure isolation; effects are XADDed; not modelled: the ACL,
  the id floor.
* ``XRANGE key - + COUNT n``: a stream's first n entries (what KeyedRunner sends behind
  fetch-1 and commit-1).
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
import logging
import math
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
        #: String keys (locks): key -> value.
        self.strings: dict[str, str] = {}
        #: Streams: key -> [(id, [field, value, ...]), ...], oldest first.
        self.streams: dict[str, list[tuple[str, list[str]]]] = {}
        self.hashes: dict[str, dict[str, str]] = {}
        self.zsets: dict[str, dict[str, float]] = {}
        #: The group's pending entries of the LBS: entry id -> consumer.
        self.pending: dict[str, str] = {}
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

    def _ack(self, entry_id: str, stream: str) -> bool:
        """XACK + XDEL of an LBS entry: whether it was pending."""
        if self.pending.pop(entry_id, None) is None:
            return False
        self.streams[stream] = [e for e in self.streams.get(stream, []) if e[0] != entry_id]
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
            del zset[m]
        return len(gone)

    def _cmd_zremrangebyrank(self, keys: list[str], args: list[str]) -> Any:
        zset = self.zsets.get(args[0], {})
        ranked = sorted(zset, key=lambda m: zset[m])
        start, stop = int(args[1]), int(args[2])
        start = max(0, start + len(ranked) if start < 0 else start)
        stop = stop + len(ranked) if stop < 0 else stop
        gone = ranked[start : stop + 1]
        for m in gone:
            del zset[m]
        return len(gone)

    # -- done-n.lua ------------------------------------------------------------------

    def _script_done_n(self, keys: list[str], args: list[str]) -> Any:
        n = len(keys) - 1
        if args[4]:
            return Err("ERR the fake wire does not model done-n beside a Go fleet")
        if len(args) != 3 * n + 5:
            return Err(f"ERR lbs done-n: got {len(keys)} keys and {len(args)} arguments")
        retry = args[2] == "1"
        values, ids = args[5 : 5 + n], args[5 + n : 5 + 2 * n]
        out = []
        for lock, value, entry_id in zip(keys[1:], values, ids):
            holder = self.strings.get(lock)
            if holder is not None:
                if holder == value:
                    del self.strings[lock]
                    self._ack(entry_id, keys[0])
                    out.append(1)
                else:
                    out.append(3)
            elif self.type_of(lock) != "none":
                out.append(3)
            elif self._ack(entry_id, keys[0]):
                out.append(2)
            else:
                out.append(4 if retry else 3)
        return "".join(map(str, out))  # one digit per lock, as the script replies

    # -- requeue-6.lua --------------------------------------------------------------

    def _script_requeue_6(self, keys: list[str], args: list[str]) -> Any:
        lbs_key, dlq, lock, parked, due = keys[:5]
        args = args + [""] * (22 - len(args))
        entry_id, mode, value = args[1], args[2], args[3]
        retry_field, original_field, fp = args[6], args[7], args[12]
        holder, foreign = self.strings.get(lock), self.type_of(lock) not in ("none", "string")
        if mode == "owned" and (foreign or holder != value):
            return [0, "lock"]
        if mode == "absent" and (foreign or holder is not None):
            return [0, "lock"]

        def release() -> None:
            if mode == "owned":
                self.strings.pop(lock, None)

        if entry_id not in self.pending:
            release()
            return [0, "acked"]
        fields = self.entry(lbs_key, entry_id)
        if fields is None:
            self.pending.pop(entry_id)
            release()
            return [-1, "trimmed"]
        retries = int(fields.pop(retry_field, 0) or 0) + int(args[4])
        original = fields.pop(original_field, entry_id)
        copy = [x for kv in fields.items() for x in kv]
        copy += [retry_field, str(retries), original_field, original]
        max_retries = int(args[5])
        dead = args[10] == "1" or (
            max_retries >= 0 and retries > max_retries and "lbs-keyed" not in fields
        )
        delay = 0
        if not dead and int(args[13]) > 0:
            d = min(int(args[13]) * 2 ** max(retries - 1, 0), int(args[14]))
            delay = math.floor(d * float(args[15]))
        bad = None
        if dead and args[11] == "1":
            bad = self._misfit(dlq, "stream", "a stream")
        elif delay > 0:
            bad = self._misfit(parked, "stream", "a stream") or self._misfit(
                due, "zset", "the due index"
            )
        if bad:
            return [-2, bad]
        if dead and args[11] == "1":
            copy += [fp + "reason", args[8], fp + "consumer", args[9], fp + "failed_id", entry_id]
            if args[19]:
                copy += [fp + "traceback", args[19]]
            code, new = 2, self.add(dlq, copy)
        elif dead:
            code, new = 3, ""
        elif delay > 0:
            code, new = 4, self.add(parked, copy)
            self.zsets.setdefault(due, {})[new] = int(new.split("-")[0]) + delay
        else:
            code, new = 1, self.add(lbs_key, copy)
        self._ack(entry_id, lbs_key)
        release()
        reply = [code, new, fields.get("lbs-input", ""), retries]
        return [*reply, delay] if code == 4 else reply

    # -- fetch-1.lua and commit-1.lua (keyed) -------------------------------------

    def _script_fetch_1(self, keys: list[str], args: list[str]) -> Any:
        prefix, lock_prefix, batch = args[0], args[1], int(args[2])
        out: list[Any] = []
        for at in range(3, len(args), 3):
            key, entry, value = args[at : at + 3]
            state_key, data = prefix + "m:" + key, prefix + "k:" + key
            if self.strings.get(lock_prefix + entry) != value:
                out.append([2])
                continue
            if self.type_of(state_key) not in ("none", "hash"):
                out.append([4, f"{state_key} holds a {self.type_of(state_key)}"])
                continue
            st = self.hashes.setdefault(state_key, {})
            holder, pos = st.get("holder"), st.get("pos", "")
            token = value.split(":")[0]
            # Gone: another entry's holder (if its lock is gone), or this entry's under an earlier lock.
            other = holder is not None and holder != entry
            dead = other or (holder == entry and st.get("token", token) != token)
            if other and lock_prefix + holder in self.strings:
                out.append([3, holder])
                continue
            fails, unblamed, until = (
                int(st.get("fails", 0)),
                int(st.get("unblamed", 0)),
                st.get("until", ""),
            )
            tries = int(st.get("tries", 0)) + 1
            rest = self._after(data, pos, batch if until == "" and fails == 0 else 1)
            if dead and rest:  # the last hold ended with its holder: a failed hold
                if until or fails > 0 or len(rest) == 1:
                    fails, unblamed = fails + 1 + unblamed, 0
                else:
                    until, unblamed = rest[-1][0], 1
                st.update(fails=str(fails), unblamed=str(unblamed), until=until)
            st.update(holder=entry, token=token, reg=entry, tries=str(tries))
            out.append([1, tries, pos, fails, unblamed, until])
        return out

    def _after(self, data: str, pos: str, count: int) -> list[tuple[str, list[str]]]:
        return [e for e in self.streams.get(data, []) if not pos or _id_below(pos, e[0])][:count]

    def _script_commit_1(self, keys: list[str], args: list[str]) -> Any:
        prefix, lock_prefix, dlq, fp = args[0], args[1], args[4], args[5]
        max_retries, consumer = int(args[6]), args[7]
        out: list[Any] = []
        finished: list[str] = []
        at = 8
        while at < len(args):
            key, entry, value, pos, mode, reg, reason, trace, count = args[at : at + 9]
            effects, nxt = [], at + 9
            for _ in range(int(count)):
                f = int(args[nxt + 1])
                effects.append((args[nxt], args[nxt + 2 : nxt + 2 + f]))
                nxt += 2 + f
            at = nxt
            state_key = prefix + "m:" + key
            st = self.hashes.get(state_key)
            if (
                self.strings.get(lock_prefix + entry) != value
                or st is None
                or st.get("holder") != entry
            ):
                out.append([2])
                continue
            refused = next((s for s, _ in effects if self.type_of(s) not in ("none", "stream")), "")
            if refused:
                why = f"{refused} holds a {self.type_of(refused)}, not a stream"
                out.append([7, "an effect cannot be written: " + why])
                continue
            step = _Step(key, entry, pos, mode, reg, reason, trace, effects)
            out.append(
                self._commit(
                    keys[0], prefix, lock_prefix, st, step, finished, dlq, fp, max_retries, consumer
                )
            )
        for entry in finished:
            self._ack(entry, keys[0])
        return out

    def _commit(
        self,
        lbs_key: str,
        prefix: str,
        lock_prefix: str,
        st: dict[str, str],
        step: _Step,
        finished: list[str],
        dlq: str,
        fp: str,
        max_retries: int,
        consumer: str,
    ) -> Any:
        """One key's step, as commit-1.lua's ``commit(i)``."""
        data, state_key, lock = (
            prefix + "k:" + step.key,
            prefix + "m:" + step.key,
            lock_prefix + step.entry,
        )
        position = st.get("pos", "")
        moved = step.pos != "" and step.pos != position
        if moved:
            position = step.pos
        rest = self._after(data, position, 1)
        if moved:
            for stream, fields in step.effects:
                self.add(stream, fields)

        def release() -> Any:
            self.strings.pop(lock, None)
            self.hashes.pop(state_key, None)
            self.streams.pop(data, None)
            finished.append(step.entry)
            return [5]

        fail = _parse_fail(step.mode)
        last_n = step.mode.startswith("last:") and int(step.mode[5:])
        if not rest and fail is None and step.mode != "skip":
            return release()
        was_fails, was_unblamed = int(st.get("fails", 0)), int(st.get("unblamed", 0))
        fails, unblamed, until = was_fails, was_unblamed, st.get("until", "")
        if moved:
            fails = 0
        going, count = ("last", last_n) if last_n else (step.mode, 0)
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
        if not rest:
            return release()
        registers = going in ("yield", "park")
        if moved:
            st["pos"], st["tries"] = position, "0" if registers else "1"
            self.streams[data] = [
                e for e in self.streams.get(data, []) if _id_below(position, e[0])
            ]
        st.update(fails=str(fails), unblamed=str(unblamed), until=until)
        if registers:
            delay = fail.delay if going == "park" and fail else 0
            target = prefix + "delayed" if delay > 0 else lbs_key
            reg = self.add(target, ["lbs-input", step.registration, "lbs-keyed", "1"])
            st["reg"] = reg
            st.pop("holder", None)
            st.pop("token", None)
            self.strings.pop(lock, None)
            finished.append(step.entry)
            return [6, reg]
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


@dataclass
class _Fail:
    delay: int
    blame: bool
    last: str
    n: int


def _parse_fail(mode: str) -> _Fail | None:
    if not mode.startswith("fail:"):
        return None
    _, ms, blame, last, n = mode.split(":")
    return _Fail(int(ms), blame == "1", last, int(n))


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
    ``Link`` on the client), and the server's version set as ``Topology.start`` would."""

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
        self._token = 100

    @property
    def metrics(self) -> Mapping[str, float]:
        return self.hooks.counts

    def deliver(self, stream: str, fields: Mapping[str, Any] | None = None) -> str:
        """An LBS entry for ``stream``, delivered to this consumer (pending, not locked); its id."""
        n = self.names
        entry_id = self.fake.add(
            n.stream_key, {"lbs-input": encode_input(stream).decode(), **(fields or {})}
        )
        self.fake.pending[entry_id] = n.id
        return entry_id

    def take(
        self, stream: str, fields: Mapping[str, Any] | None = None, retry_count: int = 0
    ) -> Held:
        """A stream taken as the reader takes one: delivered, locked with our value, in the holdings."""
        n = self.names
        entry_id = self.deliver(stream, fields)
        self._token += 1
        value = f"{self._token}:{n.lock_owner}"
        h = Held(
            entry_id, stream, {}, retry_count, self._token, value, n.lock_key_prefix + entry_id
        )
        self.fake.strings[h.lock_key] = value
        self.state.holdings.table.add(h)
        return h
