"""The ``smcr`` command: tools in the habits of Linux smc-tools.

Sub-commands grow with the project; each is a small function taking the parsed
arguments and returning an exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

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


def _cmd_demo(args: argparse.Namespace) -> int:
    """The main job (see the README): an SMC-R connection between two processes;
    ``--capture`` runs the wire-level demo (a sample conversation decoded by tshark)."""
    from rich.console import Console  # noqa: PLC0415 - keep `smcr decline` light

    if args.capture:
        from smcr.tools import wiredemo  # noqa: PLC0415

        out = Path(args.out) if args.out else None
        return wiredemo.run(out, Console())
    from smcr.tools import demo  # noqa: PLC0415

    return demo.run(Console())


def _cmd_bench(args: argparse.Namespace) -> int:
    """SMC-R against TCP on this host: throughput and ping-pong latency."""
    from rich.console import Console  # noqa: PLC0415

    from smcr.tools import benchcli  # noqa: PLC0415

    return benchcli.run(args, Console())


def _cmd_device(args: argparse.Namespace) -> int:
    """The RNICs of this host (``smcr device show`` of smc-tools)."""
    from smcr.stack.devices import rnic_kind  # noqa: PLC0415
    from smcr.tools import device  # noqa: PLC0415

    return device.run(args.json, rnic_kind())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``smcr`` command."""
    parser = argparse.ArgumentParser(prog="smcr", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"smcr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    decline = sub.add_parser("decline", help="explain SMC decline / fallback reason codes")
    decline.add_argument("codes", nargs="+", metavar="CODE", help="hex code, e.g. 0x03010000")
    decline.set_defaults(func=_cmd_decline)
    demo = sub.add_parser("demo", help="show smcr at work (see the README)")
    demo.add_argument("--capture", action="store_true",
                      help="the wire-level demo: an SMC-R conversation decoded by tshark")
    demo.add_argument("--out", metavar="DIR",
                      help="with --capture: where to write the capture "
                           "(default: a new private temp dir)")
    demo.set_defaults(func=_cmd_demo)
    bench = sub.add_parser("bench", help="SMC-R vs TCP throughput and latency on this host")
    bench.add_argument("--json", action="store_true", help="machine-readable results")
    bench.add_argument("--reps", type=int, default=5, help="repetitions (median; default 5)")
    bench.add_argument("--sizes", help="comma-separated write sizes in bytes "
                       "(default 1 KiB .. 1 MiB)")
    bench.add_argument("--volume", type=int, default=64, help="MiB per throughput run")
    bench.add_argument("--rounds", type=int, default=2000, help="ping-pong round trips per run")
    bench.add_argument("--bufsize", type=int, default=0,
                       help="SO_SNDBUF/SO_RCVBUF for SMC-R (default: the RNIC's, "
                            "1 MiB shm, 4 MiB RoCE)")
    bench.add_argument("--rnic", choices=["shm", "roce"],
                       default=os.environ.get("SMCR_RNIC", "shm") or "shm",
                       help="the RNIC under SMC-R (default: $SMCR_RNIC or shm)")
    bench.add_argument("--netns", action="store_true",
                       help="run between two new network namespaces over a veth pair (root)")
    bench.add_argument("--mtu", type=int, default=9000, help="with --netns: the veth MTU")
    bench.set_defaults(func=_cmd_bench)
    dev = sub.add_parser("device", help="list RNICs: RoCE per interface address, shm per process")
    dev.add_argument("action", nargs="?", choices=["show"], default="show",
                     help="what to do (only 'show', as in smc-tools)")
    dev.add_argument("--json", action="store_true", help="machine-readable list")
    dev.set_defaults(func=_cmd_device)
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
