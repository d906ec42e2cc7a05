"""The CPU cost of SMC-R's data path per message, without scheduling noise.

Run: ``python bench/datapath_bench.py [--sizes 32,65536] [--count 20000] [--profile]
[--trace] [--burst N]``.

Both ends of one SMC-R connection live in this process and one thread does
``sendall`` then ``recv_into`` in turn, so what is measured is the Python work
of the send path (inline WRITE + CDC, the fused post) and of the receive path
(CQ poll, CDC into the engine, copy out, consumer cursor) -- the thread time
of each, per message -- with no wakeups, no other process and no other core
involved.  That makes it steady on a busy machine where ``smcr bench`` (two
processes, wall time) is not, and the figure to watch when the data path
changes.  ``--profile`` prints the top functions (cProfile) of the last size.
``--trace`` measures again with ``smcr trace`` running on this process (a thread
reads the stream and drops it, as a tool would): what the hooks cost the data
path (the endpoint thread's work on the records is not in these thread times).
``--burst N`` sends N messages before receiving them all (the figures stay per
message): a burst, which autocorking batches, where one message at a time never
corks.

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import socket
import statistics
import threading
import time
from collections.abc import Callable

import smcr


def pair() -> tuple[smcr.SMCSocket, smcr.SMCSocket]:
    """A connected SMC-R client and server in this process (one runtime, shm RNIC)."""
    srv = smcr.create_server(("127.0.0.1", 0))
    got: list[smcr.SMCSocket] = []
    t = threading.Thread(target=lambda: got.append(srv.accept()[0]))
    t.start()
    cli = smcr.create_connection(("127.0.0.1", srv.getsockname()[1]))
    t.join()
    srv.close()
    if not (cli.using_smc and got[0].using_smc):
        raise RuntimeError(f"not SMC-R: {cli.smc_info()}")
    return cli, got[0]


def run(cli: smcr.SMCSocket, srv: smcr.SMCSocket, size: int, count: int,
        burst: int = 1) -> tuple[float, float]:  # fmt: skip
    """Thread-time µs per ``sendall`` and per receive of one ``size``-byte message
    (``burst`` messages sent, then received)."""
    msg = bytearray(size)
    buf = memoryview(bytearray(max(size * burst, 65536)))
    clock = time.thread_time
    t_send = t_recv = 0.0
    rounds = max(1, count // burst)
    for _ in range(rounds):
        a = clock()
        for _ in range(burst):
            cli.sendall(msg)
        b = clock()
        got, want = 0, size * burst
        while got < want:
            got += srv.recv_into(buf, want - got)
        t_send += b - a
        t_recv += clock() - b
    n = rounds * burst
    return t_send / n * 1e6, t_recv / n * 1e6


def start_trace() -> Callable[[], None]:
    """``smcr trace`` of this process, read and dropped by a thread; returns its stop."""
    from smcr import diag  # noqa: PLC0415
    from smcr.diag import protocol  # noqa: PLC0415

    ep = diag.endpoint()
    if ep is None:
        raise RuntimeError("this process has no diag endpoint (SMCR_DIAG=0?)")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(ep.path))
    s.sendall(protocol.encode({"op": "trace"}))
    first = s.recv(1 << 16)  # the answer comes once the hooks are in
    if b'"ok":true' not in first:
        raise RuntimeError(f"no trace: {first!r}")

    def drain() -> None:
        while s.recv(1 << 20):
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()

    def stop() -> None:
        s.shutdown(socket.SHUT_WR)
        reader.join(10)
        s.close()

    return stop


def table(cli: smcr.SMCSocket, srv: smcr.SMCSocket, sizes: list[int], count: int,
          reps: int, burst: int = 1) -> None:  # fmt: skip
    """One line per size: median thread-time µs of send, receive, both."""
    print(f"{'size':>8} {'send µs':>9} {'recv µs':>9} {'total µs':>9}")
    for size in sizes:
        n = max(500, count * 1024 // max(size, 1024))
        run(cli, srv, size, min(n, 2000), burst)  # warm-up
        runs = [run(cli, srv, size, n, burst) for _ in range(reps)]
        send = statistics.median(r[0] for r in runs)
        recv = statistics.median(r[1] for r in runs)
        print(f"{size:>8} {send:>9.2f} {recv:>9.2f} {send + recv:>9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="32,1024,65536", help="message sizes, comma-separated")
    ap.add_argument("--count", type=int, default=20000, help="messages per repetition")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (median)")
    ap.add_argument("--profile", action="store_true", help="cProfile the last size")
    ap.add_argument("--burst", type=int, default=1,
                    help="messages sent before they are received (default 1)")
    ap.add_argument("--trace", action="store_true",
                    help="then again while smcr trace runs, then again after it")
    args = ap.parse_args()
    cli, srv = pair()
    sizes = [int(s) for s in args.sizes.split(",")]
    table(cli, srv, sizes, args.count, args.reps, args.burst)
    if args.trace:
        stop = start_trace()
        print("while tracing:")
        table(cli, srv, sizes, args.count, args.reps, args.burst)
        stop()
        print("after the trace:")
        table(cli, srv, sizes, args.count, args.reps, args.burst)
    if args.profile:
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        run(cli, srv, sizes[-1], args.count // 4, args.burst)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue())
    cli.close()
    srv.close()


if __name__ == "__main__":
    main()
