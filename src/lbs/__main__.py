"""Command line: ``python -m lbs`` (also installed as ``lbs``)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from . import __version__
from .exceptions import LbsError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lbs",
        description="lbs: spread work over Redis Streams with exclusive per-stream locks.",
    )
    p.add_argument("--version", action="version", version=f"lbs {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="write work with a Spark job and process it with consumers on an embedded Redis",
        description=(
            "Start a throwaway redis-server (>= 8.4, found as scripts/redis.sh provides it), "
            "write the work with a local Spark job through the lbs Spark sink (with lbs.Producer "
            "when pyspark, the lbs[spark] extra, is not installed), process it with consumers in "
            "one group, print what happened, and check nothing is left behind. Exits 0 on success."
        ),
    )
    demo.add_argument("--streams", type=int, default=6, help="data streams to register (default: 6)")
    demo.add_argument("--consumers", type=int, default=2, help="consumers in the group (default: 2)")
    demo.add_argument("--service", default="demo", help="service name; the LBS is <service>-input (default: demo)")
    demo.add_argument(
        "--redis-url", default=None,
        help="use this Redis instead of starting an embedded one (its data is left alone but for the demo's keys)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        return _demo(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _demo(args: argparse.Namespace) -> int:
    import logging

    from ._demo import run_demo

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from .embedded import RedisServer

    try:
        if args.redis_url:
            print(f"lbs demo: using {args.redis_url}")
            result = asyncio.run(run_demo(args.redis_url, service=args.service,
                                          streams=args.streams, consumers=args.consumers))
        else:
            with RedisServer() as server:
                v = ".".join(map(str, server.version))
                print(f"lbs demo: embedded Redis {v} at {server.url} (pid {server.pid})")
                result = asyncio.run(run_demo(server.url, service=args.service,
                                              streams=args.streams, consumers=args.consumers))
    except LbsError as exc:
        print(f"lbs demo: {exc}", file=sys.stderr)
        return 1
    print("lbs demo: OK" if result.ok else "lbs demo: FAILED")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
