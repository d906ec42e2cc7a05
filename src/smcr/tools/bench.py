"""``smcr bench``: SMC-R against plain TCP on this host, measured in the same run.

Two processes (the peer is spawned, as a server would be): for each message
size, the client streams ``size``-byte ``sendall`` calls for a fixed volume to a
sink that ``recv_into``s a 64 KiB buffer and acknowledges the end with one
byte; then a ping-pong of small messages (``sendall`` + ``recv(MSG_WAITALL)``)
gives the round-trip latency, and the same ping-pong between two event loops
(non-blocking sockets, each end waiting in ``selectors``, as asyncio and most
servers wait) the latency a program of that kind sees: its wake-ups go through the
connection's readiness descriptor, not through a blocked call.  Beside each, the
CPU time both processes spent per message (or round trip): unlike wall time it
hardly depends on what else the machine runs.  Every figure is the median of ``--reps``
repetitions, SMC-R and TCP alternating so that both see the same machine; the
ratio is SMC/TCP (throughput: higher is better; latency: lower is better).
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import selectors
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

SIZES = [1024, 4096, 16384, 65536, 262144, 1 << 20]
PING_SIZES = [32, 1024]
EVENT_LOOP_SIZE = 32
"""Message size of the event-loop round trip."""


@dataclass
class BenchResult:
    """Medians of one measurement for both transports."""

    test: str
    size: int
    unit: str
    smc: float
    tcp: float
    smc_runs: list[float] = field(default_factory=list)
    tcp_runs: list[float] = field(default_factory=list)
    smc_cpu: float = 0.0
    """CPU time per message (throughput) or round trip (latency), µs, both processes, median."""
    tcp_cpu: float = 0.0

    @property
    def ratio(self) -> float:
        """SMC/TCP."""
        return self.smc / self.tcp if self.tcp else 0.0


def _listeners(bufsize: int, host: str) -> tuple[Any, socket.socket]:
    import smcr  # noqa: PLC0415 - only in the peer process

    smc = smcr.create_server((host, 0))
    if bufsize:
        smc.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, bufsize)
        smc.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, bufsize)
    tcp = socket.create_server((host, 0))
    return smc, tcp


def peer_main(ctl: Connection, bufsize: int, host: str = "127.0.0.1",
              netns: str | None = None) -> None:  # fmt: skip
    """The peer process: sinks and echoes on request, over SMC-R or TCP.

    :param netns: the network namespace to serve from (``--netns``: host B).
    """
    if netns is not None:
        from smcr.tools.netns import enter_netns  # noqa: PLC0415

        enter_netns(netns)
    smc, tcp = _listeners(bufsize, host)
    ctl.send((smc.getsockname()[1], tcp.getsockname()[1]))
    buf = bytearray(1 << 16)
    while True:
        cmd = ctl.recv()
        if cmd[0] == "quit":
            return
        kind, arg = cmd[1], cmd[2]
        if cmd[0] == "accept":  # arg connections: accept, one byte each way, close
            cpu = time.process_time()
            listener = smc if kind == "smc" else tcp
            for _ in range(arg):
                conn, _ = listener.accept()
                conn.recv(1)
                conn.sendall(b"y")
                conn.close()
            ctl.send(time.process_time() - cpu)
            continue
        conn, _ = (smc if kind == "smc" else tcp).accept()
        cpu = time.process_time()
        with conn:
            if cmd[0] == "sink":
                got = 0
                while got < arg:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    got += n
                conn.sendall(b"k")
            elif cmd[0] == "loop-echo":  # arg = message size, echoed from an event loop
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with EventLoopEnd(conn) as end:
                    view = memoryview(bytearray(arg))
                    while end.recv_exactly(view):
                        end.send_all(view)
            else:  # echo: arg = message size
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                msg = bytearray(arg)
                while conn.recv_into(msg, arg, socket.MSG_WAITALL) == arg:
                    conn.sendall(msg)
        ctl.send(time.process_time() - cpu)


class Bench:
    """The client side; owns the peer process."""

    def __init__(self, bufsize: int = 0, host: str = "127.0.0.1",
                 peer_netns: str | None = None) -> None:  # fmt: skip
        self.bufsize = bufsize
        self.host = host
        ctx = mp.get_context("spawn")
        self.ctl, child = ctx.Pipe()
        self.proc = ctx.Process(target=peer_main, args=(child, bufsize, host, peer_netns),
                                daemon=True)  # fmt: skip
        self.proc.start()
        if not self.ctl.poll(30):
            raise RuntimeError("bench peer did not start")
        self.ports = self.ctl.recv()

    def _connect(self, kind: str) -> Any:
        import smcr  # noqa: PLC0415

        port = self.ports[0] if kind == "smc" else self.ports[1]
        if kind == "tcp":
            return socket.create_connection((self.host, port))
        s = smcr.SMCSocket()
        if self.bufsize:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.bufsize)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.bufsize)
        s.connect((self.host, port))
        if not s.using_smc:
            raise RuntimeError(f"bench: SMC-R not used ({s.smc_info().reason})")
        return s

    def throughput(self, kind: str, size: int, volume: int) -> tuple[float, float]:
        """Bytes per second streaming ``size``-byte writes, and CPU µs per write (both ends)."""
        count = max(1, volume // size)
        self.ctl.send(("sink", kind, count * size))
        s = self._connect(kind)
        payload = memoryview(bytearray(size))
        t0, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            s.sendall(payload)
        s.recv(1)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu
        s.close()
        return count * size / elapsed, (cpu + self._peer_cpu()) / count * 1e6

    def pingpong(self, kind: str, size: int, rounds: int) -> tuple[float, float]:
        """Microseconds per round trip, and CPU µs per round trip (both ends)."""
        self.ctl.send(("echo", kind, size))
        s = self._connect(kind)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = bytearray(size)
        warm = min(50, rounds)
        for _ in range(warm):
            s.sendall(msg)
            s.recv_into(msg, size, socket.MSG_WAITALL)
        t0, cpu = time.perf_counter(), time.process_time()
        for _ in range(rounds):
            s.sendall(msg)
            s.recv_into(msg, size, socket.MSG_WAITALL)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu
        s.close()
        # the peer's figure includes the warm-up round trips
        return elapsed / rounds * 1e6, (cpu / rounds + self._peer_cpu() / (rounds + warm)) * 1e6

    def event_loop_pingpong(self, kind: str, size: int, rounds: int) -> tuple[float, float]:
        """:meth:`pingpong` between two event loops (:class:`EventLoopEnd`): microseconds and
        CPU µs (both ends) per round trip."""
        self.ctl.send(("loop-echo", kind, size))
        s = self._connect(kind)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = memoryview(bytearray(size))
        warm = min(50, rounds)
        with EventLoopEnd(s) as end:
            for _ in range(warm):
                end.send_all(msg)
                end.recv_exactly(msg)
            t0, cpu = time.perf_counter(), time.process_time()
            for _ in range(rounds):
                end.send_all(msg)
                if not end.recv_exactly(msg):
                    raise RuntimeError("bench peer closed the event-loop ping-pong")
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu
        s.close()
        return elapsed / rounds * 1e6, (cpu / rounds + self._peer_cpu() / (rounds + warm)) * 1e6

    def connections(self, kind: str, count: int, plain_peer: bool = False) -> tuple[float,
                                                                                   float]:
        """Microseconds per connection (connect, one byte each way, close), and CPU µs per
        connection (both ends).  ``plain_peer``: the server is a plain TCP one, and
        ``kind`` says whether the client is an smcr or a plain socket (what a peer that
        does not speak SMC pays for an smcr client)."""
        import smcr  # noqa: PLC0415

        server = "tcp" if plain_peer else kind
        port = self.ports[0] if server == "smc" else self.ports[1]
        self.ctl.send(("accept", server, count))
        t0, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            s = smcr.SMCSocket() if kind == "smc" else socket.socket()
            s.connect((self.host, port))
            s.sendall(b"x")
            s.recv(1)
            s.close()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu
        return elapsed / count * 1e6, (cpu + self._peer_cpu()) / count * 1e6

    def _peer_cpu(self) -> float:
        """The peer's CPU seconds for the last transfer (it reports when the connection ends)."""
        if not self.ctl.poll(30):
            raise RuntimeError("bench peer did not report")
        return float(self.ctl.recv())

    def close(self) -> None:
        """Stop the peer."""
        self.ctl.send(("quit",))
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def run(sizes: list[int], reps: int, volume: int, rounds: int, bufsize: int = 0,
        progress: Callable[[str], None] | None = None, host: str = "127.0.0.1",
        peer_netns: str | None = None, connections: int = 0) -> list[BenchResult]:  # fmt: skip
    """Measure everything; ``progress(label)`` is called before each measurement.

    :param host: the peer's address; :param peer_netns: the peer's namespace (``--netns``).
    :param connections: connections per run of the set-up tests (0: none): SMC-R (link
        group reused) against TCP, and an smcr client against a plain client, both to
        a plain TCP server.
    """
    bench = Bench(bufsize, host, peer_netns)
    results: list[BenchResult] = []

    def measure(test: str, unit: str, size: int,
                one: Callable[[str], tuple[float, float]]) -> None:  # fmt: skip
        runs: dict[str, list[float]] = {"smc": [], "tcp": []}
        cpus: dict[str, list[float]] = {"smc": [], "tcp": []}
        for rep in range(reps):
            for kind in ("smc", "tcp"):
                if progress:
                    progress(f"{test} {size} B {kind} #{rep + 1}")
                value, cpu = one(kind)
                runs[kind].append(value)
                cpus[kind].append(cpu)
        med = statistics.median
        results.append(BenchResult(test, size, unit, med(runs["smc"]), med(runs["tcp"]),
                                   runs["smc"], runs["tcp"], med(cpus["smc"]),
                                   med(cpus["tcp"])))  # fmt: skip

    try:
        for size in sizes:
            measure("throughput", "MB/s", size, functools.partial(_throughput, bench, size, volume))
        for size in PING_SIZES:
            measure("latency", "us", size, functools.partial(_pingpong, bench, size, rounds))
        measure("event loop", "us", EVENT_LOOP_SIZE,
                functools.partial(bench.event_loop_pingpong, size=EVENT_LOOP_SIZE, rounds=rounds))
        if connections:
            bench.connections("smc", 1)  # first contact: the link group, then reused
            bench.connections("tcp", 1)
            measure("connect", "us", 1, functools.partial(bench.connections, count=connections))
            measure("connect to plain", "us", 1,
                    functools.partial(bench.connections, count=connections, plain_peer=True))
    finally:
        bench.close()
    return results


class EventLoopEnd:
    """One end of the event-loop ping-pong: a non-blocking socket whose calls wait in a
    ``selectors`` selector when they would block, as an event loop's do (a context
    manager: the socket goes blocking again, the selector closed, on exit)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        sock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ)

    def __enter__(self) -> EventLoopEnd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sel.close()
        self.sock.setblocking(True)

    def recv_exactly(self, out: memoryview) -> bool:
        """Fill ``out``, each read after the selector said the socket is readable (an event
        loop's order: wait, then read); False at EOF."""
        got, size = 0, len(out)
        while got < size:
            self.sel.select()
            try:
                n = self.sock.recv_into(out[got:])
            except BlockingIOError:  # (readable for a moment only: wait again)
                continue
            if not n:
                return False
            got += n
        return True

    def send_all(self, data: memoryview) -> None:
        """Send all of ``data``, waiting for writability when the socket takes none."""
        sent = 0
        while sent < len(data):
            try:
                sent += self.sock.send(data[sent:])
            except BlockingIOError:
                self.sel.modify(self.sock, selectors.EVENT_WRITE)
                self.sel.select()
                self.sel.modify(self.sock, selectors.EVENT_READ)


def _throughput(bench: Bench, size: int, volume: int, kind: str) -> tuple[float, float]:
    rate, cpu = bench.throughput(kind, size, volume)
    return rate / 1e6, cpu


def _pingpong(bench: Bench, size: int, rounds: int, kind: str) -> tuple[float, float]:
    return bench.pingpong(kind, size, rounds)


def to_json(results: list[BenchResult], conditions: dict[str, Any] | None = None) -> str:
    """Machine-readable results, each with the run's ``conditions`` (``load``, ``cpus``)."""
    extra = conditions or {}
    return json.dumps([{**asdict(r), "ratio": r.ratio, **extra} for r in results], indent=2)
