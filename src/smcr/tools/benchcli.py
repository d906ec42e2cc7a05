"""``smcr bench`` front end: progress display (rich) and the results table or JSON."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from smcr.tools import bench


def run(args: argparse.Namespace, console: Console) -> int:
    """Run the benchmark as the arguments say; print a table, or JSON with ``--json``."""
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else bench.SIZES
    steps = (len(sizes) + len(bench.PING_SIZES)) * args.reps * 2
    err = Console(stderr=True)
    with Progress(console=err, transient=True, disable=args.json and not err.is_terminal) as bar:
        task = bar.add_task("smcr bench", total=steps)

        def progress(label: str) -> None:
            bar.update(task, advance=1, description=label)

        results = bench.run(sizes, args.reps, args.volume << 20, args.rounds, args.bufsize,
                            progress)  # fmt: skip
    if args.json:
        print(bench.to_json(results))
        return 0
    table = Table(title=f"SMC-R (shm RNIC) vs TCP loopback, median of {args.reps}")
    for col in ("test", "size", "SMC-R", "TCP", "unit", "SMC/TCP"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r.test, str(r.size), f"{r.smc:.1f}", f"{r.tcp:.1f}", r.unit,
                      f"{r.ratio:.2f}")  # fmt: skip
    console.print(table)
    console.print("throughput: higher is better; latency (round trip): lower is better")
    return 0
