"""Verbs-level benchmark of the shm RNIC, beside memcpy and Python TCP loopback.

Run: ``python bench/verbs_bench.py [--seconds 0.5]``.  Prints, for 4 KiB .. 1 MiB:

* RDMA WRITE bandwidth between two processes: batches of 64 WRs per
  ``post_send``, only the last one signaled (``ib_write_bw`` likewise keeps a
  deep send queue and moderates completions);
* a plain memcpy (``memoryview`` slice assignment, the copy the WRITE itself does, between
  buffers laid out as the WRITE's);
* Python TCP loopback (``sendall`` to another process that ``recv_into``s);

then SEND ping-pong latency (44-byte SENDs, as SMC-R's CDC messages) beside a
TCP ping-pong of 44 bytes.  All figures come from the same run on the same
machine; the WRITE's goal is >= 50 % of memcpy from 64 KiB up.

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import socket
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from smcr.rdma import (
    AccessFlag,
    CompletionQueue,
    QpCap,
    QueuePair,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    WcStatus,
    WrOpcode,
)
from smcr.rdma.shm import ShmDevice

SIZES = [4096, 16384, 65536, 262144, 1 << 20]
RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ
BATCH = 64
MSG = 44


def _wait(cq: CompletionQueue, timeout: float = 10.0) -> None:
    wcs = cq.wait(timeout, 1)
    if not wcs or wcs[0].status is not WcStatus.SUCCESS:
        raise RuntimeError(f"completion missing or failed: {wcs}")


def _echo(qp: QueuePair, cq: CompletionQueue, addr: int, lkey: int, rounds: int) -> None:
    """Peer side of the ping-pong: each receive is answered by a SEND (receives reposted)."""
    sge = Sge(addr, MSG, lkey)
    for _ in range(rounds):
        while True:
            wcs = cq.wait(10.0, 1)
            if not wcs:
                raise RuntimeError("echo: no message")
            if wcs[0].opcode.name == "RECV":
                break
        qp.post_recv(RecvWr(wr_id=0, sg_list=(sge,)))
        qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.SEND, sg_list=(sge,)))


def peer(conn: Connection, directory: str, spin: float) -> None:
    """The second process: owns the RMB, echoes SENDs, sinks and echoes TCP."""
    CompletionQueue.SPIN_SECONDS = spin
    dev = ShmDevice("bench-peer", directory=Path(directory))
    pd = dev.alloc_pd()
    cq = dev.create_cq()
    qp = pd.create_qp(cq, cq)
    rmb = pd.alloc_mr(1 << 20, RW)
    buf = pd.alloc_mr(4096, AccessFlag.LOCAL_WRITE)
    conn.send({"gid": dev.gid, "qpn": qp.qp_num, "rkey": rmb.rkey, "addr": rmb.addr})
    remote = conn.recv()
    qp.to_rts(dgid=remote["gid"], dest_qp_num=remote["qpn"], rq_psn=1, sq_psn=2, access=RW)
    qp.post_recv([RecvWr(wr_id=0, sg_list=(Sge(buf.addr, MSG, buf.lkey),)) for _ in range(8)])
    conn.send("up")
    listener = socket.create_server(("127.0.0.1", 0))
    conn.send(listener.getsockname()[1])
    while True:
        cmd, *args = conn.recv()
        if cmd == "echo":
            _echo(qp, cq, buf.addr, buf.lkey, args[0])
            conn.send("done")
        elif cmd == "tcp_sink":
            sock, _ = listener.accept()
            sink = bytearray(1 << 20)
            view = memoryview(sink)
            got = 0
            while got < args[0]:
                n = sock.recv_into(view)
                if not n:
                    break
                got += n
            sock.sendall(b"k")
            sock.close()
        elif cmd == "tcp_echo":
            sock, _ = listener.accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            small = bytearray(MSG)
            for _ in range(args[0]):
                sock.recv_into(small, MSG, socket.MSG_WAITALL)
                sock.sendall(small)
            sock.close()
        elif cmd == "quit":
            listener.close()
            dev.close()
            conn.send("bye")
            return


def bench_memcpy(src: memoryview, seconds: float) -> float:
    """Bytes per second of ``dst[:] = src`` into a page-aligned mapping, as a WRITE copies.

    The reference copies as the WRITE does: from the WRITE's own source MR into a
    fresh mapping (the peer's RMB is one).  How fast a copy runs depends on where
    the two buffers sit relative to each other and to pages (the C library picks its
    routine by size and alignment; some CPUs slow down when source and target alias
    modulo 4 KiB).  Two heap ``bytearray`` s, the earlier reference, gave 2.5 GB/s
    at 64 and 256 KiB on one machine of this kind while its WRITE did far more.
    """
    size = len(src)
    with mmap.mmap(-1, size) as target:
        dst = memoryview(target)
        try:
            dst[:] = src  # back the target's pages before timing
            n, t0 = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < seconds:
                for _ in range(BATCH):
                    dst[:] = src
                n += BATCH
        finally:
            dst.release()
    return n * size / elapsed


def bench_write(qp: QueuePair, cq: CompletionQueue, src: Sge, info: dict[str, Any],
                seconds: float) -> float:  # fmt: skip
    """Bytes per second of RDMA WRITEs of ``src`` into the peer's RMB."""
    sge, size = (src,), src.length
    plain = SendWr(wr_id=0, opcode=WrOpcode.RDMA_WRITE, sg_list=sge,
                   remote_addr=info["addr"], rkey=info["rkey"])  # fmt: skip
    last = SendWr(wr_id=1, opcode=WrOpcode.RDMA_WRITE, sg_list=sge, send_flags=SendFlag.SIGNALED,
                  remote_addr=info["addr"], rkey=info["rkey"])  # fmt: skip
    batch = [plain] * (BATCH - 1) + [last]
    qp.post_send(batch)  # warm-up: maps the peer's region
    _wait(cq)
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        qp.post_send(batch)
        _wait(cq)
        n += BATCH
    return n * size / elapsed


def bench_tcp(conn: Connection, port: int, size: int, seconds: float) -> float:
    """Bytes per second of ``sendall(size)`` over loopback to the peer process."""
    payload = memoryview(bytearray(size))
    total = max(size * 64, int(2e9 * seconds))
    total -= total % size
    conn.send(("tcp_sink", total))
    sock = socket.create_connection(("127.0.0.1", port))
    t0 = time.perf_counter()
    for _ in range(total // size):
        sock.sendall(payload)
    sock.recv(1)
    elapsed = time.perf_counter() - t0
    sock.close()
    return total / elapsed


def bench_pingpong(qp: QueuePair, cq: CompletionQueue, conn: Connection, buf: Sge,
                   rounds: int) -> float:  # fmt: skip
    """Microseconds per SEND round trip (44 bytes each way)."""
    sge = (buf,)
    conn.send(("echo", rounds))
    t0 = time.perf_counter()
    for _ in range(rounds):
        qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.SEND, sg_list=sge))
        while True:
            wcs = cq.wait(10.0, 1)
            if not wcs:
                raise RuntimeError("ping-pong: no answer")
            if wcs[0].opcode.name == "RECV":
                break
        qp.post_recv(RecvWr(wr_id=0, sg_list=sge))
    elapsed = time.perf_counter() - t0
    assert conn.recv() == "done"
    return elapsed / rounds * 1e6


def bench_tcp_pingpong(conn: Connection, port: int, rounds: int) -> float:
    """Microseconds per 44-byte TCP round trip over loopback."""
    conn.send(("tcp_echo", rounds))
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = bytearray(MSG)
    t0 = time.perf_counter()
    for _ in range(rounds):
        sock.sendall(msg)
        sock.recv_into(msg, MSG, socket.MSG_WAITALL)
    elapsed = time.perf_counter() - t0
    sock.close()
    return elapsed / rounds * 1e6


def main() -> None:
    """Run everything and print one table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.5, help="time per bandwidth point")
    ap.add_argument("--rounds", type=int, default=5000, help="ping-pong round trips")
    ap.add_argument("--spin", type=float, default=CompletionQueue.SPIN_SECONDS,
                    help="seconds a CQ wait polls before it sleeps (both processes)")  # fmt: skip
    args = ap.parse_args()
    CompletionQueue.SPIN_SECONDS = args.spin
    directory = tempfile.mkdtemp(prefix="smcr-b")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=peer, args=(child, directory, args.spin), daemon=True)
    proc.start()
    dev = ShmDevice("bench", directory=Path(directory))
    pd = dev.alloc_pd()
    cq = dev.create_cq()
    qp = pd.create_qp(cq, cq, QpCap(max_send_wr=BATCH))
    src = pd.alloc_mr(1 << 20, AccessFlag.LOCAL_WRITE)
    src.buf[:] = os.urandom(1 << 20)
    info = parent.recv()
    parent.send({"gid": dev.gid, "qpn": qp.qp_num})
    qp.to_rts(dgid=info["gid"], dest_qp_num=info["qpn"], rq_psn=2, sq_psn=1, access=RW)
    assert parent.recv() == "up"
    port = parent.recv()

    head = ("size", "RDMA WRITE", "memcpy", "TCP loopback")
    print(f"{head[0]:>8} | {head[1]:>12} | {head[2]:>12} | {head[3]:>12} | WRITE/memcpy")
    for size in SIZES:
        w = bench_write(qp, cq, Sge(src.addr, size, src.lkey), info, args.seconds)
        m = bench_memcpy(src.buf[:size], args.seconds)
        t = bench_tcp(parent, port, size, args.seconds)
        print(f"{size // 1024:>5} KiB | {w / 1e9:>7.2f} GB/s | {m / 1e9:>7.2f} GB/s | "
              f"{t / 1e9:>7.2f} GB/s | {100 * w / m:>5.0f} %")  # fmt: skip
    buf = pd.alloc_mr(4096, AccessFlag.LOCAL_WRITE)
    qp.post_recv([RecvWr(wr_id=0, sg_list=(Sge(buf.addr, MSG, buf.lkey),)) for _ in range(8)])
    rtt = bench_pingpong(qp, cq, parent, Sge(buf.addr, MSG, buf.lkey), args.rounds)
    tcp_rtt = bench_tcp_pingpong(parent, port, args.rounds)
    print(f"SEND ping-pong (44 B): {rtt:.1f} us round trip; TCP loopback: {tcp_rtt:.1f} us")
    parent.send(("quit",))
    parent.recv()
    proc.join(10)
    dev.close()
    os.rmdir(directory)


if __name__ == "__main__":
    main()
