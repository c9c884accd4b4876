"""`andante` command line: one sub-command per module in this package."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

# sub-command -> module with `add_parser(subparsers)` and `run(args) -> int`
COMMANDS = ("simulate", "experiment", "serve", "batch", "bench", "generate", "calibrate")
#: Sub-commands that may run the real engine: andante's OpenMP wait policy first.
TORCH_COMMANDS = ("serve", "batch", "generate", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="andante",
        description="LLM serving that schedules by the user's experience, and its simulator.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"andante.cli.{name.replace('-', '_')}").add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command in TORCH_COMMANDS:  # before anything imports torch (and libgomp)
        from andante.exec.omp_wait import choose_wait_policy

        logging.getLogger(__name__).info("%s", choose_wait_policy(os.environ))
    try:
        return int(args.run(args))
    except ValueError as exc:  # bad option values: a clear message, no traceback
        print(f"andante {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
