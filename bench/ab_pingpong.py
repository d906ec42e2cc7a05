"""A/B of the blocking round trip between two unrelated processes, beside busy ones.

Run: ``python bench/ab_pingpong.py --variant old=PYTHONPATH=/tmp/old/src --variant new=
[--rounds 10] [--load 1] [--count 20000] [--size 32]``.

The most sensitive figure of a change to the data path's per-message CPU: a client and a
server started apart (``smcr.create_connection`` / ``smcr.create_server``, TCP_NODELAY),
``sendall`` then ``recv_into(MSG_WAITALL)`` of ``--size`` bytes, ``--count`` round trips
timed after 300 of warm-up, while ``--load`` processes (``while True: pass``, nice 0) keep
CPUs busy for the whole run.  Every round runs each variant once and plain TCP once, so a
load that comes and goes falls on all alike; then per variant: the round trip's median
[min..max], the client's CPU per round trip (user and system, from ``os.times``), and the
ratio of the medians to TCP's.  A variant is a name and environment settings as in
``bench/ab_bench.py`` (``NAME=VAR=value,...``; a worktree of another commit first on the
path with ``PYTHONPATH``, after ``python -m smcr.nativebuild`` there: each tree needs its own
compiled build, or it runs pure Python and says so on stderr).

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from typing import Any

from announced import server_port  # (beside this file)

WARMUP = 300


def serve(kind: str, size: int) -> None:
    """The server: echo ``size``-byte messages until the client closes.  It listens on a
    port the kernel picks and says which (a port picked here could be taken: an ephemeral
    port of another connection)."""
    srv: Any
    if kind == "smc":
        import smcr  # noqa: PLC0415 - the TCP runs import nothing of smcr

        srv = smcr.create_server(("127.0.0.1", 0))
    else:
        srv = socket.create_server(("127.0.0.1", 0))
    print("ready", srv.getsockname()[1], flush=True)
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(size)
    while conn.recv_into(buf, size, socket.MSG_WAITALL) == size:
        conn.sendall(buf)
    conn.close()
    srv.close()


def client(port: int, kind: str, size: int, count: int) -> None:
    """The client: ``count`` timed round trips; prints ``rtt_us user_us sys_us``."""
    conn: Any
    if kind == "smc":
        import smcr  # noqa: PLC0415 - the TCP runs import nothing of smcr

        conn = smcr.create_connection(("127.0.0.1", port))
    else:
        conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf, msg = bytearray(size), b"x" * size
    for _ in range(WARMUP):
        conn.sendall(msg)
        conn.recv_into(buf, size, socket.MSG_WAITALL)
    t0, c0 = time.perf_counter(), os.times()
    for _ in range(count):
        conn.sendall(msg)
        conn.recv_into(buf, size, socket.MSG_WAITALL)
    dt, c1 = time.perf_counter() - t0, os.times()
    conn.close()
    print(f"{dt / count * 1e6:.3f} {(c1.user - c0.user) / count * 1e6:.3f} "
          f"{(c1.system - c0.system) / count * 1e6:.3f}", flush=True)  # fmt: skip


def run_once(kind: str, env: dict[str, str], size: int, count: int) -> tuple[float, ...]:
    """One server and one client, as separate processes; the client's three figures."""
    me = [sys.executable, os.path.abspath(__file__)]
    with server_port([*me, "--serve", kind, str(size)], env, 30) as port:
        out = subprocess.run([*me, "--client", str(port), kind, str(size), str(count)],
                             env=env, capture_output=True, text=True, check=True)  # fmt: skip
    return tuple(float(x) for x in out.stdout.split())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME=VAR=value,... (repeat)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=10, help="runs of each variant")
    ap.add_argument("--load", type=int, default=1, help="busy processes beside the runs")
    ap.add_argument("--count", type=int, default=20000, help="timed round trips per run")
    ap.add_argument("--size", type=int, default=32, help="message bytes")
    args = ap.parse_args()
    variants = []
    for text in args.variant:
        name, _, rest = text.partition("=")
        settings = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
        variants.append((name, {**os.environ, **settings}))
    variants.append(("tcp", dict(os.environ)))
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]  # fmt: skip
    figures: dict[str, list[tuple[float, ...]]] = defaultdict(list)
    try:
        for _ in range(args.rounds):
            for name, env in variants:
                kind = "tcp" if name == "tcp" else "smc"
                figures[name].append(run_once(kind, env, args.size, args.count))
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    tcp_rtt = statistics.median(f[0] for f in figures["tcp"])
    print(f"{args.size} B blocking round trip, {args.load} busy process(es), "
          f"{args.rounds} rounds of {args.count}: median [min..max]")  # fmt: skip
    for name, runs in figures.items():
        rtt = [f[0] for f in runs]
        user = statistics.median(f[1] for f in runs)
        system = statistics.median(f[2] for f in runs)
        print(f"  {name:10s} {statistics.median(rtt):8.1f} us [{min(rtt):.1f}..{max(rtt):.1f}]"
              f"  x TCP {statistics.median(rtt) / tcp_rtt:5.2f}"
              f"  client CPU/RT user {user:5.1f} us, system {system:5.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
