"""When each step of a sequential SMC-R connection happens, in both processes.

Run: ``python bench/connect_timeline.py [--count 2000] [--warm 300]``.

A client connects, sends a byte, reads the answer and closes, ``--count`` times (after
``--warm`` connections not counted); the server (forked: one accept loop, its listener's
background accepts in smcr's watcher thread) accepts, reads, answers and closes.  The
socket layer's steps are wrapped in both processes to note when they begin (``>``) and end
(``<``) by the monotonic clock both share: the client's ``socket()``, ``connect``,
``start_handshake`` (the Proposal built and sent), ``finish_handshake``, ``sendall``,
``recv`` and ``close``; the server's watcher (``W.``: its accept and the handshake's start,
the Accept sent) and the handshake's end (``ended``: the Confirm taken), its ``accept``,
``recv``, ``send`` and ``close``.  Printed: each event's median offset from the client's
start of its connection, in order.  Where the medians fall out of order (a busy host), a
step of one connection overlaps the next's.  The wrappers cost a little each; read the
gaps between steps, not the absolute times.

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

Event = tuple[str, int]
EVENTS: list[Event] = []


def mark(name: str) -> None:
    EVENTS.append((name, time.perf_counter_ns()))


def wrap(owner: Any, attr: str, name: str) -> None:
    """Note when ``owner.attr`` is entered and left."""
    inner: Callable[..., Any] = getattr(owner, attr)

    def noted(*args: Any, **kwargs: Any) -> Any:
        mark(name + ">")
        try:
            return inner(*args, **kwargs)
        finally:
            mark(name + "<")

    setattr(owner, attr, noted)


def server(ports: Connection, report: Connection, total: int, warm: int) -> None:
    import smcr  # noqa: PLC0415
    from smcr.socket import acceptq, handshake  # noqa: PLC0415

    wrap(acceptq.AcceptQueue, "_on_readable", "W.accept")
    wrap(handshake, "start_handshake", "W.start_handshake")
    wrap(acceptq.AcceptQueue, "_handshake_ended", "ended")
    listener = smcr.create_server(("127.0.0.1", 0))
    ports.send(listener.getsockname()[1])
    for i in range(total):
        if i == warm:
            EVENTS.clear()
        mark("S.accept>")
        conn, _ = listener.accept()
        mark("S.accept<")
        conn.recv(1)
        mark("S.recv<")
        conn.sendall(b"y")
        mark("S.send<")
        conn.close()
        mark("S.close<")
    report.send(EVENTS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--warm", type=int, default=300)
    args = ap.parse_args()
    total = args.count + args.warm
    ctx = mp.get_context("fork")
    ports_r, ports_w = ctx.Pipe(duplex=False)
    report_r, report_w = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=server, args=(ports_w, report_w, total, args.warm), daemon=True)
    proc.start()
    port = ports_r.recv()
    import smcr  # noqa: PLC0415
    from smcr.socket import handshake  # noqa: PLC0415

    wrap(handshake, "start_handshake", "C.start_handshake")
    wrap(handshake, "finish_handshake", "C.finish_handshake")
    starts: list[int] = []
    for i in range(total):
        if i == args.warm:
            EVENTS.clear()
            starts.clear()
        starts.append(time.perf_counter_ns())
        s = smcr.SMCSocket()
        mark("C.socket<")
        s.connect(("127.0.0.1", port))
        mark("C.connect<")
        s.sendall(b"x")
        mark("C.send<")
        s.recv(1)
        mark("C.recv<")
        s.close()
        mark("C.close<")
    events = sorted(EVENTS + report_r.recv(), key=lambda e: e[1])
    proc.join(10)
    offsets: dict[str, list[int]] = {}
    begun = iter([*starts[1:], 2**63])
    start, following = starts[0], next(begun)
    seen: dict[str, int] = {}
    for name, at in events:
        while at >= following:  # the next connection's events
            start, following, seen = following, next(begun), {}
        key = name if name not in seen else f"{name}#{seen[name]}"
        seen[name] = seen.get(name, 0) + 1
        offsets.setdefault(key, []).append(at - start)
    common = [(statistics.median(v), k) for k, v in offsets.items() if len(v) > args.count // 2]
    print(f"{args.count} connections: median µs from the client's socket() call")
    for median, key in sorted(common):
        print(f"{median / 1000:9.1f}  {key}")


if __name__ == "__main__":
    main()
