"""The ``smcr`` command: tools in the habits of Linux smc-tools.

Sub-commands grow with the project; each is a small function taking the parsed
arguments and returning an exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from smcr import __version__
from smcr.wire.decline import describe


def _cmd_decline(args: argparse.Namespace) -> int:
    """Explain diagnosis codes, as ``smcss`` prints them (``0x03010000`` or ``3010000``)."""
    status = 0
    for text in args.codes:
        try:
            code = int(text, 16)
        except ValueError:
            print(f"smcr: not a hexadecimal code: {text!r}", file=sys.stderr)
            status = 2
            continue
        print(describe(code))
    return status


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``smcr`` command."""
    parser = argparse.ArgumentParser(prog="smcr", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"smcr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    decline = sub.add_parser("decline", help="explain SMC decline / fallback reason codes")
    decline.add_argument("codes", nargs="+", metavar="CODE", help="hex code, e.g. 0x03010000")
    decline.set_defaults(func=_cmd_decline)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``smcr`` console script and ``python -m smcr``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    status: int = args.func(args)
    return status
