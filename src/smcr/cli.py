"""The ``smcr`` command: tools in the habits of Linux smc-tools.

Sub-commands grow with the project; each is a small function taking the parsed
arguments and returning an exit status (:data:`EXIT_STATUS`).  Bad input is one
line on standard error and status 2, never a traceback: every argument has a
checked type (:mod:`smcr.tools.argtypes`), and every ``SMCR_*`` variable is
checked before a sub-command runs (:mod:`smcr.settings`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from smcr import __version__, settings
from smcr.tools import argtypes
from smcr.wire.decline import describe

EXIT_STATUS: dict[int, str] = {
    0: "success (chk: SMC-R was used and the echo came back whole)",
    1: "the command ran and what it checked or did failed (chk: no SMC-R, or the echo "
       "differs; pnet/ueid: the table refused the change or has invalid lines; "
       "enable: the kernel refused; trace: nothing to trace; bench --conns: a "
       "connection could not be opened, fell back to TCP or saw an error)",
    2: "bad usage: an argument or an SMCR_* variable with a value that is not allowed "
       "(one line on standard error names it and what is allowed)",
    126: "run: the command cannot be executed",
    127: "run: the command was not found",
    130: "interrupted (Ctrl-C) where a command does not stop on it by design",
}
"""Exit statuses of every sub-command; ``smcr run`` otherwise exits with its program's."""

MAX_CODE = 0xFFFFFFFF


def _cmd_decline(args: argparse.Namespace) -> int:
    """Explain diagnosis codes, as ``smcss`` prints them (``0x03010000`` or ``3010000``)."""
    status = 0
    for text in args.codes:
        try:
            code = int(text, 16)
        except ValueError:
            code = -1
        if not 0 <= code <= MAX_CODE:
            print(f"smcr decline: {text!r} is not allowed: expected a hexadecimal code of "
                  "32 bits (e.g. 0x03010000)", file=sys.stderr)  # fmt: skip
            status = 2
            continue
        print(describe(code))
    return status


def _cmd_demo(args: argparse.Namespace) -> int:
    """The main job (see the README): an SMC-R connection between two processes;
    ``--capture`` runs the wire-level demo (a sample conversation decoded by tshark),
    ``--failover`` the redundant-links demo (root)."""
    from rich.console import Console  # noqa: PLC0415 - keep `smcr decline` light

    if args.failover:
        from smcr.tools import faildemo  # noqa: PLC0415

        return faildemo.run(Console())
    if args.capture:
        from smcr.tools import wiredemo  # noqa: PLC0415

        out = Path(args.out) if args.out else None
        return wiredemo.run(out, Console())
    from smcr.tools import demo  # noqa: PLC0415

    return demo.run(Console())


def _cmd_bench(args: argparse.Namespace) -> int:
    """SMC-R against TCP on this host: throughput and ping-pong latency, or N connections
    at once (``--conns``)."""
    from rich.console import Console  # noqa: PLC0415

    from smcr.tools import benchcli  # noqa: PLC0415

    return benchcli.run(args, Console())


def _cmd_device(args: argparse.Namespace) -> int:
    """The RNICs of this host (``smcr device show`` of smc-tools)."""
    from smcr.stack.devices import rnic_kind  # noqa: PLC0415
    from smcr.tools import device  # noqa: PLC0415

    return device.run(args.json, rnic_kind())


def _cmd_enable(args: argparse.Namespace) -> int:
    """Load the SMC TCP-option program for a cgroup and pin it (root, once per boot)."""
    from smcr.discovery import bpf  # noqa: PLC0415

    cgroup = Path(args.cgroup) if args.cgroup else None
    try:
        state = bpf.enable(cgroup)
    except OSError as exc:
        print(f"smcr enable: {exc.strerror or exc}", file=sys.stderr)
        if exc.errno == 1:
            print("smcr enable: loading a BPF program needs root (CAP_BPF, CAP_NET_ADMIN)",
                  file=sys.stderr)
        return 1
    print(f"SMC TCP option enabled for cgroup {state.cgroup} (program id {state.prog_id}, "
          f"pinned in {state.pin_dir}); smcr sockets of its processes now use discovery")
    if state.replaced:
        print(f"smcr enable: it replaced an earlier smcr's program (id {state.replaced}): "
              "processes started before keep that program's map and open TCP "
              "connections until they restart")
    return 0


def _cmd_disable(args: argparse.Namespace) -> int:
    """Detach the TCP-option program and remove its pins."""
    from smcr.discovery import bpf  # noqa: PLC0415

    try:
        was = bpf.disable()
    except OSError as exc:
        print(f"smcr disable: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print("SMC TCP option disabled" if was else "SMC TCP option was not enabled")
    return 0


def _cmd_discovery(args: argparse.Namespace) -> int:
    """Which discovery mode an smcr program started here would use, and why."""
    import json  # noqa: PLC0415

    from smcr import discovery  # noqa: PLC0415
    from smcr.discovery import bpf  # noqa: PLC0415

    found = discovery.current()
    state = bpf.status()
    rules = [str(rule) for rule in found.rules.rules]
    if args.json:
        print(json.dumps({"mode": found.mode, "why": found.why, "bpf_enabled": state.enabled,
                          "bpf_cgroup": str(state.cgroup) if state.cgroup else None,
                          "bpf_pin_dir": str(state.pin_dir), "peers": rules,
                          "tcp_ports": [list(r) for r in found.tcp_ports]}))
        return 0
    print(f"discovery: {found.mode} ({found.why})")
    if state.enabled:
        print(f"TCP option: enabled for {state.attached_to()}, pinned in {state.pin_dir}"
              + ("" if state.covers_us else "; this process is outside that cgroup"))
    else:
        print(f"TCP option: not enabled ({state.why})")
    for rule in rules:
        print(f"peer: {rule}")
    if found.tcp_ports:
        ports = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in found.tcp_ports)
        print(f"plain TCP (SMCR_TCP_PORTS): connections of ports {ports}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """Run a Python program with every TCP socket an SMC socket (``smc_run``)."""
    from smcr.run.launcher import run  # noqa: PLC0415

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    return run(command, args.rmb, args.sndbuf, args.debug)


def _cmd_pnet(args: argparse.Namespace) -> int:
    """The host's PNET table, as smc-tools' ``smc_pnet`` (:mod:`smcr.pnet`)."""
    from smcr import pnet  # noqa: PLC0415

    if args.action in ("add", "del") and not args.pnetid:
        return argtypes.fail("pnet", f"{args.action} needs a PNET ID (smcr pnet {args.action} "
                             "PNETID ...)")  # fmt: skip
    try:
        if args.action == "add":
            pnet.add(args.pnetid, args.netdev, args.rnic)
        elif args.action == "del":
            pnet.remove(args.pnetid)
        elif args.action == "flush":
            pnet.flush()
        else:
            for e in pnet.load():
                print(f"{e.pnetid} {e.kind} {e.name}")
            return _report_invalid("pnet", pnet.path_from(), pnet.invalid_lines())
    except pnet.PnetError as exc:
        print(f"smcr pnet: {exc} ({exc.errno_name})", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"smcr pnet: {pnet.path_from()}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_ueid(args: argparse.Namespace) -> int:
    """The host's user EIDs for SMC-Rv2, as smc-tools' ``smc_ueid`` (:mod:`smcr.ueid`)."""
    from smcr import ueid  # noqa: PLC0415

    if args.action in ("add", "del") and not args.ueid:
        return argtypes.fail("ueid", f"{args.action} needs a UEID (smcr ueid {args.action} "
                             "UEID)")  # fmt: skip
    try:
        if args.action == "add":
            ueid.add(args.ueid)
        elif args.action == "del":
            ueid.remove(args.ueid)
        elif args.action == "flush":
            ueid.flush()
        else:
            for eid in ueid.load():
                print(ueid.decode(eid))
            return _report_invalid("ueid", ueid.path_from(), ueid.invalid_lines())
    except ueid.UeidError as exc:
        print(f"smcr ueid: {exc} ({exc.errno_name})", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"smcr ueid: {ueid.path_from()}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _report_invalid(command: str, path: Path, invalid: list[tuple[int, str]]) -> int:
    """Lines of a table file that every smcr process skips, on standard error: 1 if any."""
    for number, line in invalid:
        print(f"smcr {command}: {path} line {number}: {line!r} is not a valid entry "
              "(skipped)", file=sys.stderr)  # fmt: skip
    return 1 if invalid else 0


def _tool(name: str) -> Callable[[argparse.Namespace], int]:
    """The ``run(args)`` of a host-wide tool module (``smcr.tools.<name>``), imported when
    called: ``smcr decline`` stays light."""
    def call(args: argparse.Namespace) -> int:
        import importlib  # noqa: PLC0415

        status: int = importlib.import_module(f"smcr.tools.{name}").run(args)
        return status

    return call


def _add_observability(sub: Any) -> None:
    """``ss``, ``stats``, ``linkgroup``, ``info``, ``chk``, ``top``, ``trace``: every smcr
    process of the host, asked through its diag endpoint (:mod:`smcr.diag`); README
    "Observability"."""
    ss = sub.add_parser("ss", help="SMC sockets of every smcr process (as smcss)")
    ss.add_argument("-a", "--all", action="store_true", help="LISTEN and INIT sockets too")
    ss.add_argument("-l", "--listening", action="store_true", help="only LISTEN sockets")
    ss.add_argument("-d", "--debug", action="store_true",
                    help="shutdown state, token, buffer sizes, cursors")
    ss.add_argument("-R", "--smcr", action="store_true",
                    help="SMC-R sockets only, with role, RNIC, link id, GIDs")
    ss.add_argument("-W", "--wide", action="store_true", help="do not cut addresses")
    ss.add_argument("--json", action="store_true", help="machine-readable (README)")
    ss.set_defaults(func=_tool("ss"))
    stats = sub.add_parser("stats", help="SMC-R counters: host totals (as smcr stats)")
    stats.add_argument("action", nargs="?", choices=["show", "reset", "json"], default="show")
    stats.add_argument("-d", "--details", dest="detail", action="count", default=0,
                       help="per role, per version, fallback reasons, special calls")
    stats.add_argument("-a", "--absolute", action="store_true",
                       help="since the processes started, not since the last reset")
    stats.add_argument("--json", action="store_true", help="machine-readable (README)")
    stats.set_defaults(func=_tool("stats"))
    lgr = sub.add_parser("linkgroup", help="link groups and links (as smcr linkgroup)")
    lgr.add_argument("action", nargs="?", choices=["show", "link-show"], default="show")
    lgr.add_argument("-d", "--details", dest="detail", action="count", default=0,
                     help="link UIDs and devices; twice: GIDs too")
    lgr.add_argument("--json", action="store_true", help="machine-readable (README)")
    lgr.set_defaults(func=_tool("linkgroup"))
    info = sub.add_parser("info", help="what this smcr and this host can do")
    info.add_argument("--json", action="store_true", help="machine-readable (README)")
    info.set_defaults(func=_tool("info"))
    chk = sub.add_parser("chk", help="check that SMC-R works (as smc_chk)")
    chk.add_argument("-S", "--server", action="store_true", help="run an echo server")
    chk.add_argument("-C", "--connect", metavar="HOST", help="check against a server there")
    chk.add_argument("-p", "--port", type=argtypes.port, default=37373,
                     help="port (default 37373)")
    chk.add_argument("-6", dest="ipv6", action="store_true", help="IPv6")
    chk.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    chk.add_argument("--bind", help=argparse.SUPPRESS)
    chk.add_argument("--json", action="store_true", help="machine-readable (README)")
    chk.set_defaults(func=_tool("chk"))
    top = sub.add_parser("top", help="live view of link groups, links and connections")
    top.add_argument("--interval", type=argtypes.seconds(), default=1.0,
                     help="seconds between looks")
    top.add_argument("-n", "--iterations", type=argtypes.count(0), default=0,
                     help="stop after N looks (0: until Ctrl-C)")
    top.add_argument("--json", action="store_true",
                     help="one look (two with -n 2: rates) as JSON (README)")
    top.set_defaults(func=_tool("top"))
    trace = sub.add_parser("trace", help="a pcap of smcr processes' SMC-R traffic (CLC, LLC, "
                           "CDC, RDMA WRITE headers), shm RNIC included")
    trace.add_argument("-w", dest="write", metavar="FILE", required=True,
                       help="the pcap to write (a new file; '-': standard output)")
    trace.add_argument("-p", "--pid", type=argtypes.count(1, 1 << 22, "a process id"),
                       help="trace this process (default: every smcr process of yours)")
    trace.add_argument("-s", "--snaplen", type=argtypes.count(0, 4096, "bytes"), default=0,
                       metavar="BYTES",
                       help="payload bytes kept of each RDMA WRITE (0..4096; default 0)")
    trace.add_argument("-c", "--count", type=argtypes.count(1), metavar="N",
                       help="stop after N frames")
    trace.add_argument("--duration", type=argtypes.seconds(), metavar="S",
                       help="stop after S seconds")
    trace.add_argument("--json", action="store_true", help="the summary as JSON (README)")
    trace.set_defaults(func=_tool("trace"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``smcr`` command."""
    parser = argtypes.Parser(prog="smcr", description=__doc__.splitlines()[0].replace("``", ""))
    parser.add_argument("--version", action="version", version=f"smcr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    decline = sub.add_parser("decline", help="explain SMC decline / fallback reason codes")
    decline.add_argument("codes", nargs="+", metavar="CODE", help="hex code, e.g. 0x03010000")
    decline.set_defaults(func=_cmd_decline)
    demo = sub.add_parser("demo", help="show smcr at work (see the README)")
    demo.add_argument("--capture", action="store_true",
                      help="the wire-level demo: an SMC-R conversation decoded by tshark")
    demo.add_argument("--failover", action="store_true",
                      help="(root) redundant links: two RoCE paths between two namespaces, "
                           "one cut and restored during a transfer")
    demo.add_argument("--out", metavar="DIR",
                      help="with --capture: where to write the capture "
                           "(default: a new private temp dir)")
    demo.set_defaults(func=_cmd_demo)
    bench = sub.add_parser("bench", help="SMC-R vs TCP throughput and latency on this host; "
                           "with --conns: N connections at once")
    bench.add_argument("--json", action="store_true", help="machine-readable results")
    bench.add_argument("--reps", type=argtypes.count(1), default=5,
                       help="repetitions (median; default 5)")
    bench.add_argument("--sizes", type=argtypes.sizes, help="comma-separated write sizes in "
                       "bytes (default 1 KiB .. 1 MiB)")
    bench.add_argument("--volume", type=argtypes.count(1, 1 << 20, "MiB"), default=64,
                       help="MiB per throughput run")
    bench.add_argument("--rounds", type=argtypes.count(1), default=2000,
                       help="ping-pong round trips per run")
    bench.add_argument("--connections", type=argtypes.count(0), default=300,
                       help="connections per run of the set-up tests (0: skip them)")
    bench.add_argument("--conns", type=argtypes.count(1, what="connections"), metavar="N",
                       help="instead of the size sweep: N connections open at once, each "
                            "doing --exchanges request/responses of 100 B: connect time, "
                            "transactions/s, memory and descriptors per connection, memory "
                            "kept after close, SMC-R and TCP (README)")
    bench.add_argument("--exchanges", type=argtypes.count(1), default=200, metavar="K",
                       help="with --conns: request/response exchanges per connection "
                            "(default 200)")
    bench.add_argument("--bufsize", type=argtypes.count(0, 1 << 30, "bytes; 0: the RNIC's"),
                       default=0,
                       help="SO_SNDBUF/SO_RCVBUF for SMC-R (default: the RNIC's, "
                            "4 MiB on both RNICs)")
    bench.add_argument("--rnic", choices=["shm", "roce"],
                       default=settings.RNIC.text() or "shm",
                       help="the RNIC under SMC-R (default: $SMCR_RNIC or shm)")
    bench.add_argument("--netns", action="store_true",
                       help="run between two new network namespaces over a veth pair (root)")
    bench.add_argument("--mtu", type=argtypes.count(1280, 65535, "bytes"), default=9000,
                       help="with --netns: the veth MTU")
    bench.add_argument("--load", type=argtypes.count(0, 1024, "processes"), default=0,
                       metavar="N", help="N CPU-bound processes (nice 0) beside the run, both "
                       "transports measured under the same load (a busy host)")
    bench.add_argument("--cpus", metavar="LIST", type=argtypes.cpus,
                       help="pin both ends to these CPUs (as taskset -c: 0, 0,1, 0-3)")
    bench.add_argument("--plot", metavar="FILE", help="also draw SMC-R against TCP by message "
                       "size into FILE (SVG)")
    bench.set_defaults(func=_cmd_bench)
    dev = sub.add_parser("device", help="list RNICs: RoCE per interface address, shm per process")
    dev.add_argument("action", nargs="?", choices=["show"], default="show",
                     help="what to do (only 'show', as in smc-tools)")
    dev.add_argument("--json", action="store_true", help="machine-readable list")
    dev.set_defaults(func=_cmd_device)
    enable = sub.add_parser("enable", help="turn on TCP-option discovery for a cgroup (root)")
    enable.add_argument("--cgroup", metavar="DIR", type=argtypes.directory,
                        help="cgroup v2 directory (default: the root: every process)")
    enable.set_defaults(func=_cmd_enable)
    disable = sub.add_parser("disable", help="turn TCP-option discovery off again (root)")
    disable.set_defaults(func=_cmd_disable)
    run = sub.add_parser("run", help="run a Python program with its TCP sockets using SMC-R "
                         "where the peer offers it (as smc_run)")
    run.add_argument("-r", dest="rmb", metavar="SIZE", type=argtypes.buffer,
                     help="RMB (receive buffer) size, k/m suffixes (default: the RNIC's)")
    run.add_argument("-t", dest="sndbuf", metavar="SIZE", type=argtypes.buffer,
                     help="send buffer size, k/m suffixes")
    run.add_argument("-d", dest="debug", action="store_true",
                     help="print how each connection was made (standard error)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]")
    run.set_defaults(func=_cmd_run)
    disc = sub.add_parser("discovery", help="how smcr programs here learn that a peer "
                          "speaks SMC (mode and why)")
    disc.add_argument("--json", action="store_true", help="machine-readable")
    disc.set_defaults(func=_cmd_discovery)
    ueid = sub.add_parser("ueid", help="user EIDs for SMC-Rv2 (as smc_ueid; root changes "
                          "them for the host, every smcr process reads them)")
    ueid.add_argument("action", nargs="?", choices=["show", "add", "del", "flush"],
                      default="show", help="what to do (default: show)")
    ueid.add_argument("ueid", nargs="?", help="with add/del: the UEID (up to 32 characters "
                      "of A-Z, 0-9, '.', '-')")
    ueid.set_defaults(func=_cmd_ueid)
    pnet = sub.add_parser("pnet", help="PNET IDs of net devices and RNICs (as smc_pnet; root "
                          "changes them for the host, every smcr process reads them)")
    pnet.add_argument("action", nargs="?", choices=["show", "add", "del", "flush"],
                      default="show", help="what to do (default: show)")
    pnet.add_argument("pnetid", nargs="?", help="with add/del: the PNET ID (up to 16 "
                      "letters and digits; lower case is taken as upper)")
    pnet.add_argument("-I", dest="netdev", metavar="NETDEV", help="with add: a net device")
    pnet.add_argument("-D", dest="rnic", metavar="RNIC", help="with add: an RNIC (a RoCE "
                      "RNIC's device name; shm0, shm1... for a process's shm RNICs)")
    pnet.set_defaults(func=_cmd_pnet)
    _add_observability(sub)
    parser.commands = sub.choices
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``smcr`` console script and ``python -m smcr``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        settings.check()
        status: int = args.func(args)
    except settings.SettingError as exc:  # (also one met later, e.g. in a runtime's start)
        return argtypes.fail(args.command, str(exc))
    except OSError as exc:  # a file or the kernel refused: say which, in one line
        if settings.debug():
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        return argtypes.fail(args.command, f"{where}{exc.strerror or exc}", 1)
    except KeyboardInterrupt:
        return 130
    return status
