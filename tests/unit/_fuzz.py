"""A mutation fuzzer for the core's RESP reader.

It builds valid replies (every RESP2/RESP3 type, stream entries in every
layout the reader reads in place), breaks them (bit flips, cut, dropped,
repeated and inserted bytes, length headers off by a little or a lot,
splices of two replies), feeds the result in random pieces and reads it
generically and as each entry shape. The only exception allowed out of the
reader is lbs.ProtocolError; anything else is a finding, saved with its input.

    python tests/unit/_fuzz.py --seconds 600 [--seed N] [--out DIR]

Run it against a sanitizer build (see setup.py, LBS_SANITIZE=1) to catch
memory errors too. tests/unit/test_fuzz_smoke.py runs it for a moment in
every test run, so it cannot rot.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from _lbscore import NEED_MORE, EntryParser, RespReader, Shape, encode_input
from lbs import ProtocolError

SHAPES = (Shape.ANY, Shape.ENTRIES, Shape.SCRIPT_ENTRIES, Shape.XREAD, Shape.MESSAGES)


def _bulk(b: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(b), b)


def _value(rng: random.Random, depth: int = 0) -> bytes:
    kind = rng.randrange(14 if depth < 4 else 9)
    if kind == 0:
        return _bulk(rng.randbytes(rng.choice([0, 1, 5, 40, 300])))
    if kind == 1:
        return b"+%s\r\n" % rng.choice([b"OK", b"", b"QUEUED", b"x" * 20])
    if kind == 2:
        return b"-%s\r\n" % rng.choice([b"ERR x", b"NOSCRIPT No matching script", b"NOGROUP"])
    if kind == 3:
        return b":%d\r\n" % rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randrange(-(10**6), 10**6)])
    if kind == 4:
        return rng.choice([b"$-1\r\n", b"*-1\r\n", b"_\r\n", b"#t\r\n", b"#f\r\n"])
    if kind == 5:
        return b",%s\r\n" % rng.choice([b"1.5", b"-0", b"inf", b"-inf", b"nan", b"1e300", b"3"])
    if kind == 6:
        return b"(%d\r\n" % rng.randrange(-(10**30), 10**30)
    if kind == 7:
        return b"=8\r\ntxt:abcd\r\n" if rng.random() < 0.5 else b"!5\r\nERR x\r\n"
    if kind == 8:
        return _entry(rng)
    if kind in (9, 10):
        n = rng.randrange(5)
        return (
            rng.choice([b"*", b"~", b">"])
            + b"%d\r\n" % n
            + b"".join(_value(rng, depth + 1) for _ in range(n))
        )
    if kind == 11:
        n = rng.randrange(4)
        return b"%%%d\r\n" % n + b"".join(
            _bulk(b"k%d" % i) + _value(rng, depth + 1) for i in range(n)
        )
    if kind == 12:
        return b"|1\r\n+ttl\r\n:1\r\n" + _value(rng, depth + 1)
    n = rng.randrange(6)
    return b"*%d\r\n" % n + b"".join(_entry(rng) for _ in range(n))


def _entry(rng: random.Random) -> bytes:
    entry_id = b"%d-%d" % (rng.randrange(2**45), rng.randrange(10))
    doc = encode_input(
        rng.choice(["s", "session-1", "é"]), rng.choice([{}, {"a": 1}, {"k": [1, 2.5, None, "v"]}])
    )
    fields = [b"lbs-input", doc]
    if rng.random() < 0.5:
        fields += [b"_retry_count", rng.choice([b"1", b"-3", b"x", b"99999999999999999999"])]
    if rng.random() < 0.3:
        fields += [b"_original_id", entry_id]
    if rng.random() < 0.2:
        fields += [b"other", rng.randbytes(4)]
    if rng.random() < 0.1:
        body = rng.choice([b"*-1\r\n", b"_\r\n"])
    else:
        body = b"*%d\r\n" % len(fields) + b"".join(_bulk(f) for f in fields)
    if rng.random() < 0.2:  # XREADGROUP CLAIM
        return (
            b"*4\r\n"
            + _bulk(entry_id)
            + body
            + rng.choice([b":5\r\n:2\r\n", _bulk(b"5") + _bulk(b"2")])
        )
    return b"*2\r\n" + _bulk(entry_id) + body


def _reply(rng: random.Random) -> bytes:
    shape = rng.randrange(3)
    if shape == 0:
        return _value(rng)
    n = rng.randrange(5)
    body = b"*%d\r\n" % n + b"".join(_entry(rng) for _ in range(n))
    if shape == 1:
        return (b"%1\r\n" if rng.random() < 0.5 else b"*1\r\n*2\r\n") + _bulk(b"svc-input") + body
    return b"*3\r\n" + body + b"*0\r\n" + _bulk(b"0-0")


def _mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(8)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[i % len(b)] ^= 1 << rng.randrange(8)
        elif op == 1:
            del b[i:]
        elif op == 2 and b:
            del b[i % len(b)]
        elif op == 3:
            b[i:i] = rng.choice(
                [b"\r", b"\n", b"\r\n", b"-", b"0", b"9", b"*", b"$", b"%", b"|", b"\x00"]
            )
        elif op == 4:
            j = rng.randrange(len(b) + 1)
            b[i:i] = b[min(i, j) : max(i, j)][:64]
        elif op == 5:
            # a length header off by a little or a lot
            digits = [k for k in range(len(b)) if 48 <= b[k] <= 57]
            if digits:
                k = rng.choice(digits)
                b[k] = rng.choice(b"0123456789")
                if rng.random() < 0.2:
                    b[k:k] = b"9" * rng.randrange(1, 20)
        elif op == 6:
            b[i:i] = other[: rng.randrange(len(other) + 1)]
        else:
            b[i:i] = rng.randbytes(rng.randrange(1, 8))
    return bytes(b)


@dataclass
class Stats:
    inputs: int = 0
    replies: int = 0
    protocol_errors: int = 0
    findings: list[str] = field(default_factory=list)


def run_one(data: bytes, rng: random.Random, parser: EntryParser, stats: Stats) -> None:
    reader = RespReader()
    shape = rng.choice(SHAPES)
    pos = 0
    try:
        while pos < len(data):
            step = rng.choice([1, 7, 64, 4096, len(data)])
            reader.feed(data[pos : pos + step])
            pos += step
            while True:
                got = reader.gets() if shape == Shape.ANY else reader.gets_entries(parser, shape)
                if got is NEED_MORE:
                    break
                stats.replies += 1
                for e in got if type(got) is list else ():
                    if hasattr(e, "fields"):  # an Entry: its lazy parts must read too
                        e.fields  # noqa: B018
    except ProtocolError:
        stats.protocol_errors += 1


def fuzz(seconds: float, seed: int, out: Path | None = None) -> Stats:
    rng = random.Random(seed)
    parser = EntryParser()
    stats = Stats()
    corpus = [_reply(rng) for _ in range(200)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(100):
            if rng.random() < 0.05:
                corpus[rng.randrange(len(corpus))] = _reply(rng)
            data = _mutate(rng, rng.choice(corpus), rng.choice(corpus))
            if rng.random() < 0.1:
                data = data + rng.choice(corpus)  # several replies in a row
            stats.inputs += 1
            try:
                run_one(data, random.Random(stats.inputs), parser, stats)
            except Exception:
                report = f"input #{stats.inputs} (seed {seed}): {data!r}\n{traceback.format_exc()}"
                stats.findings.append(report)
                if out is not None:
                    out.mkdir(parents=True, exist_ok=True)
                    (out / f"finding-{seed}-{stats.inputs}.txt").write_text(report)
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="how long to run (default 600)")
    ap.add_argument(
        "--seed", type=int, default=int(time.time()), help="random seed (default: the time)"
    )
    ap.add_argument("--out", type=Path, default=None, help="directory for findings")
    args = ap.parse_args(argv)
    started = time.monotonic()
    stats = fuzz(args.seconds, args.seed, args.out)
    took = time.monotonic() - started
    print(
        f"seed {args.seed}: {stats.inputs} inputs in {took:.0f} s ({stats.inputs / took:.0f}/s), "
        f"{stats.replies} replies read, {stats.protocol_errors} protocol errors, "
        f"{len(stats.findings)} findings"
    )
    for f in stats.findings[:5]:
        print(f)
    return 1 if stats.findings else 0


if __name__ == "__main__":
    sys.exit(main())
