"""A/B of ``smcr bench`` between variants, in alternating runs, on a busy host.

Run: ``python bench/ab_bench.py --variant main=PYTHONPATH=/tmp/main/src --variant new=
[--rounds 5] -- --sizes 1024,4096 --connections 0``.

Each variant is a name and environment settings (``NAME=VAR=value,VAR=value``;
none: the tree as installed).  A variant's tree goes first on the path with
``PYTHONPATH`` (e.g. a ``git archive <commit> src | tar -x -C /tmp/main`` copy), a
runtime knob with its variable (``SMCR_AUTOCORK=0``).  Every round runs each
variant once (``smcr bench --json --reps 1`` plus the arguments after ``--``),
so that a load that comes and goes on a shared machine falls on all of them
alike; then each figure is printed as median [min..max] over the rounds: SMC-R's
figure, its ratio to TCP in the same run, and the CPU µs per message of both
(the steadiest of them on a busy host).

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=VAR=value,VAR=value`` -> (name, settings)."""
    name, _, rest = text.partition("=")
    env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME=VAR=value,... (repeat; at least two)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=5, help="runs of each variant")
    ap.add_argument("bench_args", nargs="*", help="after --: arguments of smcr bench")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    smcr_cli = os.path.join(os.path.dirname(sys.executable), "smcr")
    figures: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for _ in range(args.rounds):
        for name, settings in variants:
            env = {**os.environ, **settings}
            out = subprocess.run([smcr_cli, "bench", "--json", "--reps", "1", *args.bench_args],
                                 env=env, capture_output=True, text=True, check=True)  # fmt: skip
            for row in json.loads(out.stdout):
                got = figures[(row["test"], row["size"])]
                got[f"{name} {row['unit']}"].append(row["smc"])
                got[f"{name} x TCP"].append(row["ratio"])
                got[f"{name} CPU µs"].append(row["smc_cpu"])
                got[f"{name} TCP CPU µs"].append(row["tcp_cpu"])
    for (test, size), got in figures.items():
        print(f"{test} {size}")
        for label, values in got.items():
            print(f"   {label:22s} {statistics.median(values):10.2f}"
                  f"  [{min(values):.2f} .. {max(values):.2f}]")  # fmt: skip


if __name__ == "__main__":
    main()
