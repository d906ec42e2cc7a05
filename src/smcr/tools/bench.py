"""``smcr bench``: SMC-R against plain TCP on this host, measured in the same run.

Two processes (the peer is spawned, as a server would be): for each message
size, the client streams ``size``-byte ``sendall`` calls for a fixed volume to a
sink that ``recv_into``s a 64 KiB buffer and acknowledges the end with one
byte; then a ping-pong of small messages (``sendall`` + ``recv(MSG_WAITALL)``)
gives the round-trip latency.  Every figure is the median of ``--reps``
repetitions, SMC-R and TCP alternating so that both see the same machine; the
ratio is SMC/TCP (throughput: higher is better; latency: lower is better).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from typing import Any

SIZES = [1024, 4096, 16384, 65536, 262144, 1 << 20]
PING_SIZES = [32, 1024]


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
        conn, _ = (smc if kind == "smc" else tcp).accept()
        with conn:
            if cmd[0] == "sink":
                got = 0
                while got < arg:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    got += n
                conn.sendall(b"k")
            else:  # echo: arg = message size
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                msg = bytearray(arg)
                while conn.recv_into(msg, arg, socket.MSG_WAITALL) == arg:
                    conn.sendall(msg)


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

    def throughput(self, kind: str, size: int, volume: int) -> float:
        """Bytes per second streaming ``size``-byte writes."""
        count = max(1, volume // size)
        self.ctl.send(("sink", kind, count * size))
        s = self._connect(kind)
        payload = memoryview(bytearray(size))
        t0 = time.perf_counter()
        for _ in range(count):
            s.sendall(payload)
        s.recv(1)
        elapsed = time.perf_counter() - t0
        s.close()
        return count * size / elapsed

    def pingpong(self, kind: str, size: int, rounds: int) -> float:
        """Microseconds per round trip."""
        self.ctl.send(("echo", kind, size))
        s = self._connect(kind)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = bytearray(size)
        for _ in range(min(50, rounds)):  # warm-up
            s.sendall(msg)
            s.recv_into(msg, size, socket.MSG_WAITALL)
        t0 = time.perf_counter()
        for _ in range(rounds):
            s.sendall(msg)
            s.recv_into(msg, size, socket.MSG_WAITALL)
        elapsed = time.perf_counter() - t0
        s.close()
        return elapsed / rounds * 1e6

    def close(self) -> None:
        """Stop the peer."""
        self.ctl.send(("quit",))
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def run(sizes: list[int], reps: int, volume: int, rounds: int, bufsize: int = 0,
        progress: Callable[[str], None] | None = None, host: str = "127.0.0.1",
        peer_netns: str | None = None) -> list[BenchResult]:  # fmt: skip
    """Measure everything; ``progress(label)`` is called before each measurement.

    :param host: the peer's address; :param peer_netns: the peer's namespace (``--netns``).
    """
    bench = Bench(bufsize, host, peer_netns)
    results: list[BenchResult] = []
    try:
        for size in sizes:
            runs: dict[str, list[float]] = {"smc": [], "tcp": []}
            for rep in range(reps):
                for kind in ("smc", "tcp"):
                    if progress:
                        progress(f"throughput {size} B {kind} #{rep + 1}")
                    runs[kind].append(bench.throughput(kind, size, volume) / 1e6)
            results.append(BenchResult("throughput", size, "MB/s",
                                       statistics.median(runs["smc"]),
                                       statistics.median(runs["tcp"]), runs["smc"],
                                       runs["tcp"]))  # fmt: skip
        for size in PING_SIZES:
            runs = {"smc": [], "tcp": []}
            for rep in range(reps):
                for kind in ("smc", "tcp"):
                    if progress:
                        progress(f"ping-pong {size} B {kind} #{rep + 1}")
                    runs[kind].append(bench.pingpong(kind, size, rounds))
            results.append(BenchResult("latency", size, "us",
                                       statistics.median(runs["smc"]),
                                       statistics.median(runs["tcp"]), runs["smc"],
                                       runs["tcp"]))  # fmt: skip
    finally:
        bench.close()
    return results


def to_json(results: list[BenchResult]) -> str:
    """Machine-readable results."""
    return json.dumps([{**asdict(r), "ratio": r.ratio} for r in results], indent=2)
