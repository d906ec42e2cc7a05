"""Where SMC-R connection set-up spends its time (link group reused), beside TCP.

Run: ``python bench/connect_bench.py [--count 300] [--runs 3] [--profile N]``, or
``python bench/connect_bench.py --clients 8 [--count 200] [--runs 3]``.

Two processes, as ``smcr bench``'s ``connect`` row: the client connects, sends a
byte, reads the answer and closes, ``--count`` times; the server (spawned) accepts,
reads the byte, answers and closes.  The link group of the first connection is
reused by the rest.  Each run measures SMC-R then TCP: wall µs per connection and
CPU µs per connection of each process (thread-independent: every thread's time).
``--profile N`` measures SMC-R only, with cProfile in every thread of both processes (the runtime's
progress and watcher threads too), timed by each thread's CPU time (time spent
blocked or waiting for the GIL is not counted), and prints the top N functions by
own time, in µs per connection, per process; cProfile itself multiplies the cost
of small calls, so read it for where, not for how much.  A call still running at the
end (a daemon thread's wait: ``epoll.poll``, ``select.poll``) is timed by the wrong
thread's clock there: skip those lines.

``--phases`` adds, for SMC-R and TCP, where each connection's time goes: the client's
thread CPU and wall µs per call (``socket()``, ``connect``, ``sendall``, ``recv``,
``close``) and the server's CPU µs per thread (its main thread, ``smcr-watcher``, the
progress thread...: ``/proc/self/task``), medians over the runs.

``--clients N`` measures concurrent set-ups instead (issue 29: "8 concurrent client
processes", "8 clients connecting at once to one server"): N client processes, each of
which first makes one connection of its own (its runtime's first contact: a link group
of its own with the server), then waits for the others, then makes ``--count``
connections one after the other as above; the server (one process, one thread: accept,
read the byte, answer, close) serves them all.  Per run and transport: connections/s
over the phase (from the start signal to the last client's end), the client-side time
of ``connect()`` (p50, p99, max) and of the whole connection, how many connects took
longer than a second (a set-up that waited for a timeout), and, for SMC-R, how many
connections were not in SMC-R mode (fallbacks, with their reason codes) and how many
failed.

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import multiprocessing as mp
import os
import pstats
import socket
import statistics
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

_PROFILES: list[cProfile.Profile] = []


def _profile_threads() -> None:
    """Profile every thread started from now on (and this one)."""
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        _PROFILES.append(prof)
        prof.enable()
        run(self)

    threading.Thread.run = profiled  # type: ignore[method-assign]
    prof = cProfile.Profile(time.thread_time)
    _PROFILES.append(prof)
    prof.enable()


def _report(top: int, count: int, title: str) -> str:
    """The top functions by own time over every thread, µs per connection."""
    stats: pstats.Stats | None = None
    for prof in _PROFILES:
        prof.create_stats()
        if not prof.stats:
            continue
        stats = pstats.Stats(prof) if stats is None else stats.add(prof)
    out = io.StringIO()
    if stats is None:
        return ""
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    print(f"== {title}: {total / count * 1e6:.0f} µs/conn own time in all threads "
          "(under cProfile)", file=out)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])  # type: ignore[attr-defined]
    for (path, line, name), (_cc, nc, tt, ct, _callers) in rows[:top]:
        where = f"{path.rsplit('/', 2)[-2:]!s}:{line}" if "/" in path else path
        print(f"{tt / count * 1e6:8.1f} {ct / count * 1e6:8.1f} {nc / count:6.1f}  {name}  "
              f"{where}", file=out)
    return out.getvalue()


PHASES = ("socket", "connect", "sendall", "recv", "close")
"""The client's calls of one connection, as ``--phases`` times them."""


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by thread name (``comm``; threads
    of one name added up)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # (a thread that ended meanwhile)
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def server(ctl: Connection, profile: int) -> None:
    """The accepting side; reports its CPU seconds after each run, and each thread's."""
    if profile:
        _profile_threads()
    import smcr  # noqa: PLC0415

    smc = smcr.create_server(("127.0.0.1", 0))
    tcp = socket.create_server(("127.0.0.1", 0))
    ctl.send((smc.getsockname()[1], tcp.getsockname()[1]))
    total = 0
    while True:
        cmd = ctl.recv()
        if cmd[0] == "quit":
            ctl.send(_report(profile, total, "server") if profile else "")
            return
        kind, count = cmd
        listener = smc if kind == "smc" else tcp
        cpu, threads = time.process_time(), thread_cpu()
        for _ in range(count):
            conn, _ = listener.accept()
            conn.recv(1)
            conn.sendall(b"y")
            conn.close()
        if kind == "smc" and count > 1:
            total += count
        after = thread_cpu()
        ctl.send((time.process_time() - cpu,
                  {name: used - threads.get(name, 0.0) for name, used in after.items()}))


def client(kind: str, port: int, count: int) -> tuple[float, float]:
    """Wall µs and CPU µs per connection of this process."""
    import smcr  # noqa: PLC0415

    t0, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        s: Any = smcr.SMCSocket() if kind == "smc" else socket.socket()
        s.connect(("127.0.0.1", port))
        s.sendall(b"x")
        s.recv(1)
        s.close()
    return ((time.perf_counter() - t0) / count * 1e6,
            (time.process_time() - cpu) / count * 1e6)  # fmt: skip


def client_phases(kind: str, port: int, count: int) -> dict[str, tuple[float, float]]:
    """:func:`client`'s connections, each call timed: phase -> (thread CPU µs, wall µs) per
    connection."""
    import smcr  # noqa: PLC0415

    cpu_ns, wall_ns = time.thread_time_ns, time.perf_counter_ns
    used = dict.fromkeys(PHASES, (0, 0))
    for _ in range(count):
        marks = [(cpu_ns(), wall_ns())]
        s: Any = smcr.SMCSocket() if kind == "smc" else socket.socket()
        marks.append((cpu_ns(), wall_ns()))
        s.connect(("127.0.0.1", port))
        marks.append((cpu_ns(), wall_ns()))
        s.sendall(b"x")
        marks.append((cpu_ns(), wall_ns()))
        s.recv(1)
        marks.append((cpu_ns(), wall_ns()))
        s.close()
        marks.append((cpu_ns(), wall_ns()))
        for phase, (c0, w0), (c1, w1) in zip(PHASES, marks, marks[1:], strict=False):
            cpu, wall = used[phase]
            used[phase] = (cpu + c1 - c0, wall + w1 - w0)
    return {phase: (cpu / count / 1e3, wall / count / 1e3) for phase, (cpu, wall) in used.items()}


def print_phases(kind: str, client_rows: list[dict[str, tuple[float, float]]],
                 server_rows: list[dict[str, float]], count: int) -> None:  # fmt: skip
    """``--phases``' report for one transport: medians over the runs."""
    med = statistics.median
    calls = "  ".join(f"{phase} {med(r[phase][0] for r in client_rows):.0f}/"
                      f"{med(r[phase][1] for r in client_rows):.0f}" for phase in PHASES)
    names = sorted({name for r in server_rows for name in r})
    threads = "  ".join(f"{name} {med(r.get(name, 0.0) for r in server_rows) / count * 1e6:.0f}"
                        for name in names)  # fmt: skip
    print(f"{kind} client, CPU/wall µs per call: {calls}")
    print(f"{kind} server, CPU µs per connection by thread: {threads}")


def concurrent_client(kind: str, port: int, count: int, start: Any, out: Connection) -> None:
    """One of ``--clients``' processes: a first connection, then ``count`` timed ones once
    ``start`` is set; sends back (connect µs list, whole-connection µs list, fallback
    reasons, errors)."""
    import smcr  # noqa: PLC0415

    def one() -> tuple[float, float, str]:
        t0 = time.perf_counter()
        s: Any = smcr.SMCSocket() if kind == "smc" else socket.socket()
        try:
            s.connect(("127.0.0.1", port))
            t1 = time.perf_counter()
            fallback = ""
            if kind == "smc" and not s.using_smc:
                fallback = str(s.smc_info())
            s.sendall(b"x")
            if s.recv(1) != b"y":
                raise ConnectionError("wrong answer")
        finally:
            s.close()
        return (t1 - t0) * 1e6, (time.perf_counter() - t0) * 1e6, fallback

    connects: list[float] = []
    wholes: list[float] = []
    fallbacks: list[str] = []
    errors: list[str] = []
    try:
        one()  # first contact: this process's link group
    except OSError as e:
        errors.append(f"first: {e!r}")
    out.send("ready")
    start.wait()
    for _ in range(count):
        try:
            c, w, fb = one()
        except OSError as e:
            errors.append(repr(e))
            continue
        connects.append(c)
        wholes.append(w)
        if fb:
            fallbacks.append(fb)
    out.send((connects, wholes, fallbacks, errors))


def _pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def concurrent(clients: int, count: int, runs: int) -> int:
    """The ``--clients`` mode (module docstring); returns the exit status (1 if any
    connection failed or an SMC-R one fell back)."""
    ctx = mp.get_context("spawn")
    ctl, child = ctx.Pipe()
    proc = ctx.Process(target=server, args=(child, 0), daemon=True)
    proc.start()
    ports = dict(zip(("smc", "tcp"), ctl.recv(), strict=True))
    results: dict[str, list[dict[str, float]]] = {"smc": [], "tcp": []}
    bad = 0
    for _ in range(runs):
        for kind in ("smc", "tcp"):
            ctl.send((kind, clients * (count + 1)))
            start = ctx.Event()
            pipes = []
            procs = []
            for _ in range(clients):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=concurrent_client,
                                args=(kind, ports[kind], count, start, theirs), daemon=True)
                p.start()
                pipes.append(mine)
                procs.append(p)
            for pipe in pipes:
                pipe.recv()  # "ready": first contact made
            t0 = time.perf_counter()
            start.set()
            connects: list[float] = []
            wholes: list[float] = []
            fallbacks: list[str] = []
            errors: list[str] = []
            for pipe in pipes:
                c, w, fb, err = pipe.recv()
                connects += c
                wholes += w
                fallbacks += fb
                errors += err
            wall = time.perf_counter() - t0
            for p in procs:
                p.join(10)
            ctl.recv()  # the server's CPU seconds (not used here)
            row = {"per_s": len(connects) / wall, "p50": _pct(connects, 0.5),
                   "p99": _pct(connects, 0.99), "max": max(connects),
                   "whole_p50": _pct(wholes, 0.5), "whole_p99": _pct(wholes, 0.99),
                   "slow": sum(c > 1e6 for c in connects),
                   "fallbacks": len(fallbacks), "errors": len(errors)}  # fmt: skip
            results[kind].append(row)
            print(f"{kind}: {row['per_s']:7.0f} connections/s  connect p50 {row['p50']:6.0f} "
                  f"p99 {row['p99']:7.0f} max {row['max']:8.0f} µs  whole p50 "
                  f"{row['whole_p50']:6.0f} p99 {row['whole_p99']:7.0f} µs  over 1 s: "
                  f"{row['slow']}  fallbacks {len(fallbacks)}  errors {len(errors)}",
                  flush=True)  # fmt: skip
            for reason in sorted(set(fallbacks)):
                print(f"   fallback x{fallbacks.count(reason)}: {reason}")
            for err in sorted(set(errors)):
                print(f"   error x{errors.count(err)}: {err}")
            bad += len(errors) + len(fallbacks)
    ctl.send(("quit",))
    ctl.recv()
    proc.join(5)
    med = {k: {f: statistics.median(r[f] for r in rows) for f in rows[0]}
           for k, rows in results.items()}  # fmt: skip
    print(f"{clients} clients x {count} connections, {runs} runs, medians: SMC-R/TCP "
          f"connections/s {med['smc']['per_s'] / med['tcp']['per_s']:.2f}x, connect p99 "
          f"{med['smc']['p99'] / med['tcp']['p99']:.2f}x, p50 "
          f"{med['smc']['p50'] / med['tcp']['p50']:.2f}x")  # fmt: skip
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--clients", type=int, default=0, metavar="N",
                    help="N client processes connecting at once (module docstring)")
    ap.add_argument("--phases", action="store_true",
                    help="where each connection's time goes (module docstring)")
    args = ap.parse_args()
    if args.clients:
        raise SystemExit(concurrent(args.clients, args.count, args.runs))
    ctx = mp.get_context("spawn")
    ctl, child = ctx.Pipe()
    proc = ctx.Process(target=server, args=(child, args.profile), daemon=True)
    proc.start()
    ports = dict(zip(("smc", "tcp"), ctl.recv(), strict=True))
    if args.profile:
        _profile_threads()

    def one(kind: str, count: int) -> tuple[float, float, float]:
        ctl.send((kind, count))
        wall, cpu = client(kind, ports[kind], count)
        return wall, cpu, float(ctl.recv()[0]) / count * 1e6

    one("smc", 1)  # first contact: the link group, then reused
    rows: dict[str, list[tuple[float, float, float]]] = {"smc": [], "tcp": []}
    for _ in range(args.runs):
        for kind in ("smc",) if args.profile else ("smc", "tcp"):
            rows[kind].append(one(kind, args.count))
    if args.phases:
        for kind in ("smc", "tcp"):
            client_rows, server_rows = [], []
            for _ in range(args.runs):
                ctl.send((kind, args.count))
                client_rows.append(client_phases(kind, ports[kind], args.count))
                server_rows.append(ctl.recv()[1])
            print_phases(kind, client_rows, server_rows, args.count)
    print(f"{args.count} connections x {args.runs} runs: wall µs/conn, CPU µs/conn client, server")
    for kind, got in rows.items():
        if not got:
            continue
        walls = [r[0] for r in got]
        print(f"{kind}: wall {statistics.median(walls):.0f} [{min(walls):.0f}..{max(walls):.0f}]"
              f"  cpu client {statistics.median(r[1] for r in got):.0f}"
              f"  server {statistics.median(r[2] for r in got):.0f}")
    if rows["tcp"]:
        smc_wall = statistics.median(r[0] for r in rows["smc"])
        tcp_wall = statistics.median(r[0] for r in rows["tcp"])
        print(f"ratio SMC-R/TCP (medians): {smc_wall / tcp_wall:.2f}")
    ctl.send(("quit",))
    server_report = ctl.recv()
    if args.profile:
        print(_report(args.profile, args.count * args.runs, "client"))
        print(server_report)
    proc.join(5)


if __name__ == "__main__":
    main()
