"""What the kernel's UDP path costs a user-space RoCE RNIC: CPU per MiB, both ends.

Run as root: ``python bench/udp_floor.py [--mib 400] [--work]``.
Between two new network namespaces over a veth pair (MTU 9000), a sender sends
UDP GSO runs of 15 datagrams of 4112 bytes (a RoCE WRITE Middle with a 4096-byte
path MTU: BTH, payload, ICRC) and a receiver reads them with UDP GRO into a 64 KiB
buffer, 1 MiB acknowledged at a time so that nothing is lost; each process's CPU
time is reported per MiB.  ``--work`` adds what the RNIC must do per packet in
the least Python: a CRC-32 of each payload at both ends and the payload's copy
into a target buffer at the receiver.  The figure without it is the floor any
RNIC over UDP sockets starts from (smcr's figure: ``smcr bench --rnic roce --netns``,
CPU column, or ``bench/roce_bench.py``).

This is a measurement, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import ast
import os
import resource
import socket
import time

from zlib_ng.zlib_ng import crc32

from smcr.tools.netns import VethPair, enter_netns

SEG = 4112  # BTH 12 + payload 4096 + ICRC 4
PMTU = 4096
PER_SEND = 15  # what fits a 64 KiB UDP GSO send
MIB = 1 << 20
UDP_SEGMENT = 103
UDP_GRO = 104
PORT = 4791


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def receiver(ns: str, addr: str, mib: int, work: bool, report: int) -> None:
    enter_netns(ns)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
    s.bind((addr, PORT))
    s.settimeout(0.3)
    os.write(report, b"r")
    view = memoryview(bytearray(65536 + SEG))
    target = memoryview(bytearray(4 << 20))
    total = toff = acked = 0
    start = cpu()
    while total < mib * MIB:
        try:
            n, _anc, _flags, peer = s.recvmsg_into([view], 64)
        except TimeoutError:
            break  # the sender is done (or lost some): what arrived counts
        if work:
            for off in range(0, n, SEG):
                payload = view[off + 12 : off + SEG - 4]
                crc32(payload)
                if toff + PMTU > len(target):
                    toff = 0
                target[toff : toff + PMTU] = payload
                toff += PMTU
        total += n // SEG * PMTU
        if total - acked >= MIB:
            acked = total
            s.sendto(b"a", peer)
    os.write(report, repr((cpu() - start, total)).encode())


def sender(ns: str, dst: str, mib: int, work: bool, report: int) -> None:
    enter_netns(ns)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.connect((dst, PORT))
    s.settimeout(0.05)
    data = memoryview(bytearray(os.urandom(4 << 20)))
    head, tail = bytes(12), bytes(4)
    gso = [(socket.SOL_UDP, UDP_SEGMENT, SEG.to_bytes(2, "little"))]
    sent = acked = off = 0
    start = cpu()
    while sent < mib * MIB:
        while sent - acked >= 2 * MIB:  # at most 2 MiB unacknowledged
            try:
                s.recv(16)
                acked += MIB
            except TimeoutError:
                acked = sent  # an acknowledgement lost: go on
        parts: list[bytes | memoryview] = []
        for _ in range(PER_SEND):
            if off + PMTU > len(data):
                off = 0
            payload = data[off : off + PMTU]
            parts += [head, payload, crc32(payload).to_bytes(4, "little") if work else tail]
            off += PMTU
        s.sendmsg(parts, gso)
        sent += PER_SEND * PMTU
    os.write(report, repr(cpu() - start).encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=400, help="MiB to send")
    ap.add_argument("--work", action="store_true", help="CRC and copy per packet, as an RNIC")
    args = ap.parse_args()
    with VethPair(9000) as pair:
        rx_r, rx_w = os.pipe()
        if os.fork() == 0:
            receiver(pair.ns[1], pair.addr[1], args.mib, args.work, rx_w)
            os._exit(0)
        assert os.read(rx_r, 1) == b"r"
        tx_r, tx_w = os.pipe()
        if os.fork() == 0:
            sender(pair.ns[0], pair.addr[1], args.mib, args.work, tx_w)
            os._exit(0)
        t0 = time.monotonic()
        tx_cpu = float(os.read(tx_r, 100))
        rx_cpu, got = ast.literal_eval(os.read(rx_r, 100).decode())
        os.wait()
        os.wait()
        moved = got / MIB
        print(f"{'with' if args.work else 'without'} per-packet work: {moved:.0f} of "
              f"{args.mib} MiB arrived in {time.monotonic() - t0:.1f} s; CPU per MiB: sender "
              f"{tx_cpu / args.mib * 1e6:.0f} µs, receiver {rx_cpu / max(moved, 1) * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
