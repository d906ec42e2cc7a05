"""The end hosts of the routed RoCE tests: ``python -m tests.roce.routed_peer``.

``server ADDRESS CONNS``: listens on ADDRESS (port printed as JSON), then for each
of CONNS connections reads a 16-byte header (byte count, seed), the client's
bytes to EOF, and answers with as many bytes of its own pattern; prints one JSON
line per connection (mode, version, decline codes, whether the bytes matched).
``client ADDRESS PORT BYTES CONNS``: connects CONNS times one after another,
each time sending BYTES and checking what comes back; prints one JSON line per
connection with the connect time.  Every socket has a timeout: nothing waits
forever.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import sys
import time

import smcr

HEADER = struct.Struct("!QQ")
CHUNK = 1 << 16


def stream(seed: int, n: int) -> bytes:
    """``n`` bytes from ``seed`` (SHA-256 blocks), the same in both processes."""
    block = hashlib.sha256(seed.to_bytes(8, "big")).digest() * (CHUNK // 32)
    return (block * (n // len(block) + 1))[:n]


def info(s: smcr.SMCSocket) -> dict[str, object]:
    i = s.smc_info()
    return {"mode": i.mode, "version": i.version, "local": i.local_code, "peer": i.peer_code}


def recv_all(s: socket.socket) -> bytes:
    out = bytearray()
    while data := s.recv(CHUNK * 4):
        out += data
    return bytes(out)


def server(address: str, conns: int) -> None:
    srv = smcr.create_server((address, 0), family=socket.AF_INET6 if ":" in address
                             else socket.AF_INET)  # fmt: skip
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    srv.settimeout(30)
    for _ in range(conns):
        c, _ = srv.accept()
        c.settimeout(30)
        with c:
            head = b""
            while len(head) < HEADER.size and (data := c.recv(HEADER.size - len(head))):
                head += data
            if len(head) < HEADER.size:  # a client that only connected
                print(json.dumps(info(c) | {"ok": None}), flush=True)
                continue
            n, seed = HEADER.unpack(head)
            got = recv_all(c)
            c.sendall(stream(seed + 1, n))
            c.shutdown(socket.SHUT_WR)
            print(json.dumps(info(c) | {"ok": got == stream(seed, n)}), flush=True)
    srv.close()


def client(address: str, port: int, total: int, conns: int) -> None:
    for seed in range(conns):
        t0 = time.monotonic()
        s = smcr.create_connection((address, port), timeout=30)
        took = time.monotonic() - t0
        with s:
            s.sendall(HEADER.pack(total, seed) + stream(seed, total))
            s.shutdown(socket.SHUT_WR)
            ok = recv_all(s) == stream(seed + 1, total)
            print(json.dumps(info(s) | {"ok": ok, "connect": took}), flush=True)


def main() -> None:
    role, *args = sys.argv[1:]
    if role == "server":
        server(args[0], int(args[1]))
    else:
        client(args[0], int(args[1]), int(args[2]), int(args[3]))


if __name__ == "__main__":
    main()
