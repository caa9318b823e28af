"""Command line: ``python -m lbs`` (also installed as ``lbs``); the commands live in :mod:`lbs.cli`."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the ``lbs`` command with ``argv`` (default: ``sys.argv[1:]``); return its exit code."""
    from .cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
