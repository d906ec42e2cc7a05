"""``smcr bench`` front end: progress display (rich) and the results table or JSON.

``--rnic roce`` runs SMC-R over the RoCE RNIC (``SMCR_RNIC=roce`` for both
processes); with ``--netns`` the two ends are two fresh network namespaces
joined by a veth pair (``--mtu``, default 9000), this process's main thread
the client in the first, and TCP is measured over the same pair in the same
run.  The namespaces are removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from smcr import native
from smcr.tools import argtypes, bench, benchconns, benchplot, load


def run(args: argparse.Namespace, console: Console) -> int:
    """Run the benchmark as the arguments say; print a table, or JSON with ``--json``;
    ``--plot FILE`` draws the results too (:mod:`smcr.tools.benchplot`); ``--conns N``
    measures N connections at once instead (:func:`run_conns`)."""
    if args.conns:
        if args.plot:
            return argtypes.fail("bench", "--plot draws the message-size sweep, which "
                                 "--conns does not run")  # fmt: skip
        return run_conns(args, console)
    if args.plot:  # (refused before the run, not after it)
        problem = _unwritable(Path(args.plot))
        if problem:
            return argtypes.fail("bench", f"--plot {args.plot!r}: {problem}")
    sizes = args.sizes or bench.SIZES
    cpus: set[int] | None = args.cpus  # (checked by the parser: load.parse_cpus)
    steps = (len(sizes) + len(bench.PING_SIZES) + (2 if args.connections else 0)) * args.reps * 2
    err = Console(stderr=True)
    with Progress(console=err, transient=True, disable=args.json and not err.is_terminal) as bar:
        task = bar.add_task("smcr bench", total=steps)

        def progress(label: str) -> None:
            bar.update(task, advance=1, description=label)

        with (load.competitors(args.load), load.pinned(cpus),
              _hosts(args) as (host, peer_ns, where)):  # fmt: skip
            results = bench.run(sizes, args.reps, args.volume << 20, args.rounds, args.bufsize,
                                progress, host, peer_ns, args.connections)  # fmt: skip
    conditions = _conditions(args.load, cpus)
    title = (f"SMC-R ({args.rnic} RNIC) vs TCP {where}, {conditions}, median of {args.reps}; "
             f"smcr {native.status().describe()}")  # fmt: skip
    if args.plot:
        benchplot.write(Path(args.plot), results, title)
    if args.json:
        print(bench.to_json(results, {"load": args.load, "cpus": sorted(cpus) if cpus else None}))
        return 0
    table = Table(title=title)
    for col in ("test", "size", "SMC-R", "TCP", "unit", "SMC/TCP", "CPU µs SMC-R", "CPU µs TCP"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.test, str(r.size), f"{r.smc:.1f}", f"{r.tcp:.1f}", r.unit,
                      f"{r.ratio:.2f}", f"{r.smc_cpu:.1f}", f"{r.tcp_cpu:.1f}")  # fmt: skip
    console.print(table)
    console.print("throughput: higher is better; latency (round trip): lower is better; "
                  "event loop: the round trip between two selectors loops on non-blocking "
                  "sockets (as asyncio and most servers wait); CPU: both processes' CPU time "
                  "per message or round trip")  # fmt: skip
    for r in results:
        if r.test.startswith("connect"):
            console.print(f"{r.test}: {1e6 / r.smc:.0f} connections/s with smcr, "
                          f"{1e6 / r.tcp:.0f} with TCP (connect, a byte each way, close)")
    return 0


def run_conns(args: argparse.Namespace, console: Console) -> int:
    """``--conns N`` (:mod:`smcr.tools.benchconns`): the table, or JSON with ``--json``;
    1 if a connection could not be opened, fell back to TCP or saw an error."""
    cpus: set[int] | None = args.cpus
    err = Console(stderr=True)
    with Progress(console=err, transient=True, disable=args.json and not err.is_terminal) as bar:
        task = bar.add_task("smcr bench --conns", total=args.reps * 2)

        def progress(label: str) -> None:
            bar.update(task, advance=1, description=label)

        with (load.competitors(args.load), load.pinned(cpus),
              _hosts(args) as (host, peer_ns, where)):  # fmt: skip
            report = benchconns.run(args.conns, args.reps, args.exchanges, args.bufsize,
                                    progress, host, peer_ns)  # fmt: skip
    status = 0 if report.ok else 1
    if args.json:
        print(json.dumps(benchconns.to_json(report, {
            "rnic": args.rnic, "load": args.load, "cpus": sorted(cpus) if cpus else None,
            "smcr_code": native.status().describe()}), indent=2))  # fmt: skip
        return status
    table = Table(title=f"{args.conns} connections at once, {args.exchanges} exchanges of "
                  f"{benchconns.MESSAGE} B each: SMC-R ({args.rnic} RNIC) vs TCP {where}, "
                  f"{_conditions(args.load, cpus)}, median of {args.reps}; "
                  f"smcr {native.status().describe()}")  # fmt: skip
    for col in ("", "SMC-R", "TCP", "unit", "SMC/TCP"):
        table.add_column(col, justify="left" if not col else "right")
    for r in report.results:
        table.add_row(r.label, _figure(r.smc), _figure(r.tcp), r.unit,
                      _figure(r.ratio) if r.tcp else "-")  # fmt: skip
    console.print(table)
    for line in _conns_verdict(report):
        console.print(line, highlight=False)
    return status


def _figure(value: float) -> str:
    """A figure with the digits that mean something at its size."""
    return f"{value:.0f}" if value == 0 or abs(value) >= 100 else f"{value:.3g}"


def _conns_verdict(report: benchconns.ConnsReport) -> list[str]:
    """What the table does not say: fallbacks, errors, runs that could not open N."""
    smcr, opened = report.smcr_connections
    lines = []
    if report.fallbacks:
        lines.append(f"[red]FALLBACK: {opened - smcr} of {opened} connections of the SMC-R "
                     "runs fell back to TCP:[/red] " + ", ".join(
                         f"{escape(reason)} x{n}" for reason, n in report.fallbacks.items()))
    elif opened:
        lines.append(f"SMC-R runs: all {opened} connections in SMC-R mode")
    if report.errors:
        lines.append(f"[red]ERRORS ({sum(report.errors.values())}):[/red] " + "; ".join(
            f"{escape(what)} x{n}" for what, n in report.errors.items()))
    else:
        lines.append("errors: none (every response checked byte for byte)")
    lines += [f"[red]FAILED:[/red] {escape(text)}" for text in report.failures]
    lines.append("RSS and descriptors: /proc/PID of each process with every connection "
                 "open, minus before the first connect, per connection; kept after close: "
                 "RSS once every connection ended, minus before; CPU per transaction: "
                 "each process's CPU time (every thread) during the exchanges")
    return lines


def _unwritable(path: Path) -> str:
    """Why the picture cannot go to ``path`` ("" if it can)."""
    if path.is_dir():
        return "is a directory"
    if not path.parent.is_dir():
        return "no such directory"
    if not os.access(path.parent, os.W_OK):
        return "directory not writable"
    return ""


def _conditions(load_: int, cpus: set[int] | None) -> str:
    """What else the host did during the run, for the table's title."""
    text = f"{load_} CPU-bound process{'es' if load_ != 1 else ''} beside" if load_ else "idle"
    if cpus:
        names = ",".join(map(str, sorted(cpus)))
        text += f", both ends on CPU{'s' if len(cpus) > 1 else ''} {names}"
    return text


@contextlib.contextmanager
def _hosts(args: argparse.Namespace) -> Iterator[tuple[str, str | None, str]]:
    """Set up where the bench runs: ``(server address, server namespace, description)``."""
    os.environ["SMCR_RNIC"] = args.rnic  # the spawned peer inherits it
    if not args.netns:
        yield "127.0.0.1", None, "loopback"
        return
    from smcr.stack.runtime import close_stacks  # noqa: PLC0415
    from smcr.tools.netns import VethPair, enter_netns  # noqa: PLC0415

    home = os.open(f"/proc/self/task/{os.getpid()}/ns/net", os.O_RDONLY)
    try:
        with VethPair(args.mtu) as pair:
            enter_netns(pair.ns[0])
            try:
                yield pair.addr[1], pair.ns[1], f"veth between namespaces (MTU {args.mtu})"
            finally:
                close_stacks()
                enter_netns(fd=home)
    finally:
        os.close(home)
