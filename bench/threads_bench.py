"""Blocking request/response over several connections at once, a thread for each, at both ends.

Run: ``python bench/threads_bench.py [--threads 1,2,8] [--count 5000] [--size 100]
[--rounds 3] [--load 0]``.

The shape of a thread-per-connection program (a threaded HTTP client or server, a worker
pool with a connection each): a server process (``smcr.create_server`` or
``socket.create_server``) that answers each accepted connection in a thread of its own
(``recv_into``, then ``sendall`` of what came), and a client process with ``--threads``
connections and a thread each, every thread doing ``--count`` timed round trips of
``--size`` bytes (``sendall``, then ``recv_into`` with ``MSG_WAITALL``) after 200 of
warm-up, all threads started together.  Every round runs SMC-R once and plain TCP once for
each thread count, so a load that comes and goes falls on both; ``--load`` busy processes
(``while True: pass``, nice 0) run beside the whole run.  Per thread count and transport:
transactions per second over all threads (median [min..max] of the rounds), the ratio of
the medians (SMC-R over TCP: above 1, SMC-R does more), and the client's CPU per
transaction (every thread's, ``time.process_time`` from the moment the threads start).

Why: one thread's round trip is what ``smcr bench`` and ``bench/ab_pingpong.py`` measure;
a second thread that waits in its own connection's ``recv`` at the same time is woken in
another way (one application thread at a time polls the CQ: :mod:`smcr.stack.progress`),
and the figures differ by an order of magnitude (issue 23: the thread that waits woken by
the event it waits for, not through another thread).

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from typing import Any

WARMUP = 200


def serve(kind: str, size: int) -> None:
    """The server: prints its port, then echoes ``size``-byte messages on every connection,
    a thread each, until the client closes them all (it says how many first)."""
    srv: Any
    if kind == "smc":
        import smcr  # noqa: PLC0415 - the TCP runs import nothing of smcr

        srv = smcr.create_server(("127.0.0.1", 0), backlog=128)
    else:
        srv = socket.create_server(("127.0.0.1", 0), backlog=128)
    print(srv.getsockname()[1], flush=True)
    count = int(sys.stdin.readline())

    def echo(conn: Any) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(size)
        while conn.recv_into(buf, size, socket.MSG_WAITALL) == size:
            conn.sendall(buf)
        conn.close()

    threads = []
    for _ in range(count):
        conn, _ = srv.accept()
        threads.append(threading.Thread(target=echo, args=(conn,)))
        threads[-1].start()
    for t in threads:
        t.join()
    srv.close()


def client(port: int, kind: str, threads: int, size: int, count: int) -> None:
    """The client: ``threads`` connections, ``count`` timed round trips on each in a thread
    of its own; prints ``transactions_per_s cpu_us_per_transaction slowest_ms`` (the
    slowest round trip of any thread: a missed wake-up shows there as a wait of a second,
    where the rate only dips)."""
    make: Any
    if kind == "smc":
        import smcr  # noqa: PLC0415 - the TCP runs import nothing of smcr

        make = smcr.create_connection
    else:
        make = socket.create_connection
    conns = [make(("127.0.0.1", port)) for _ in range(threads)]
    began_at: list[float] = []

    def mark() -> None:  # (the barrier's action: before any thread is let go)
        began_at[:] = [time.perf_counter(), time.process_time()]

    start = threading.Barrier(threads + 1, action=mark)
    msg = b"x" * size
    slowest = [0.0]

    def run(conn: Any) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = bytearray(size)
        for _ in range(WARMUP):
            conn.sendall(msg)
            conn.recv_into(buf, size, socket.MSG_WAITALL)
        start.wait()
        clock, most = time.perf_counter, 0.0
        for _ in range(count):
            began = clock()
            conn.sendall(msg)
            if conn.recv_into(buf, size, socket.MSG_WAITALL) != size:
                raise RuntimeError("the server closed the connection")
            most = max(most, clock() - began)
        slowest[0] = max(slowest[0], most)

    workers = [threading.Thread(target=run, args=(c,)) for c in conns]
    for w in workers:
        w.start()
    start.wait()
    for w in workers:
        w.join()
    dt, cpu_s = time.perf_counter() - began_at[0], time.process_time() - began_at[1]
    for c in conns:
        c.close()
    done = threads * count
    cpu = cpu_s / done * 1e6
    print(f"{done / dt:.1f} {cpu:.3f} {slowest[0] * 1e3:.3f}", flush=True)


def run_once(kind: str, threads: int, size: int, count: int) -> tuple[float, float, float]:
    """One server and one client, as separate processes: the client's three figures."""
    me = [sys.executable, os.path.abspath(__file__)]
    server = subprocess.Popen([*me, "--serve", kind, str(size)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdin is not None and server.stdout is not None
        port = int(server.stdout.readline())
        server.stdin.write(f"{threads}\n")
        server.stdin.flush()
        out = subprocess.run([*me, "--client", str(port), kind, str(threads), str(size),
                              str(count)], capture_output=True, text=True, check=True)  # fmt: skip
        server.wait(timeout=60)  # (it ends when the client has closed every connection)
        rate, cpu, slowest = (float(x) for x in out.stdout.split())
        return rate, cpu, slowest
    finally:
        if server.poll() is None:  # (the client failed: the server still waits for it)
            server.kill()
            server.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
               int(sys.argv[6]))  # fmt: skip
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2,8", help="thread counts (comma-separated)")
    ap.add_argument("--count", type=int, default=5000, help="timed round trips per thread")
    ap.add_argument("--size", type=int, default=100, help="message bytes")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each transport")
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    args = ap.parse_args()
    counts = [int(x) for x in args.threads.split(",")]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]  # fmt: skip
    figures: dict[tuple[int, str], list[tuple[float, float, float]]] = defaultdict(list)
    try:
        for _ in range(args.rounds):
            for threads in counts:
                for kind in ("smc", "tcp"):
                    figures[threads, kind].append(run_once(kind, threads, args.size,
                                                           args.count))  # fmt: skip
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(f"{args.size} B request/response, a connection and a thread each, {args.load} busy "
          f"process(es), {args.rounds} rounds of {args.count} per thread: median [min..max]")
    for threads in counts:
        medians = {}
        for kind in ("smc", "tcp"):
            runs = figures[threads, kind]
            rates = [r for r, _, _ in runs]
            medians[kind] = statistics.median(rates)
            cpu = statistics.median(c for _, c, _ in runs)
            slowest = max(w for _, _, w in runs)
            print(f"  {threads:3d} thread(s) {kind}  {medians[kind]:9.0f} tx/s "
                  f"[{min(rates):.0f}..{max(rates):.0f}]  client CPU/tx {cpu:6.1f} us  "
                  f"slowest round trip {slowest:7.1f} ms")
        print(f"  {threads:3d} thread(s) SMC-R/TCP {medians['smc'] / medians['tcp']:.2f}x")


if __name__ == "__main__":
    main()
