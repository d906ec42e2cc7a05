"""The end hosts of the RoCE loss tests: ``python -m tests.roce.loss_peer``.

``server ADDRESS CONNS``: listens on ADDRESS (port printed as JSON) and serves
CONNS connections at once, each in its own thread: a 16-byte header (byte count,
seed), the client's bytes to EOF, then as many bytes of its own pattern; one JSON
line per connection (mode, version, whether the bytes matched, or the error).
``client ADDRESS PORT BYTES BEFORE AFTER``: opens BEFORE connections, prints
``{"up": BEFORE}`` and waits for a line on stdin (the test turns the loss on
then), opens AFTER more, and runs all of them at once; one JSON line per
connection with its connect and transfer times.
``sink ADDRESS``: listens (port printed), takes one connection, reads it to EOF and
prints what came (mode, bytes, whether they matched the sender's).
``sender ADDRESS PORT BYTES``: connects with a send buffer that holds them all,
prints ``{"up": 1}``, waits for a line on stdin, sends a header and BYTES, closes and
exits at once: its exit must deliver what is still unsent or in flight.
Every socket has a timeout: nothing waits forever.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any

import smcr
from tests.roce.routed_peer import HEADER, info, recv_all, stream

#: Every wait of a socket (a transfer at 30% loss takes seconds, not minutes).
TIMEOUT = 90.0
_print_lock = threading.Lock()


def emit(row: dict[str, Any]) -> None:
    with _print_lock:
        print(json.dumps(row), flush=True)


def serve_one(c: smcr.SMCSocket) -> None:
    row: dict[str, Any] = {}
    try:
        with c:
            row = info(c)
            head = b""
            while len(head) < HEADER.size and (data := c.recv(HEADER.size - len(head))):
                head += data
            n, seed = HEADER.unpack(head)
            got = recv_all(c)
            c.sendall(stream(seed + 1, n))
            c.shutdown(socket.SHUT_WR)
            row["ok"] = got == stream(seed, n)
    except Exception as e:  # (reported to the test, which fails on it)
        row |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
    emit(row)


def server(address: str, conns: int) -> None:
    srv = smcr.create_server((address, 0), family=socket.AF_INET6 if ":" in address
                             else socket.AF_INET)  # fmt: skip
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    srv.settimeout(TIMEOUT)
    threads = []
    for _ in range(conns):
        c, _ = srv.accept()
        c.settimeout(TIMEOUT)
        threads.append(threading.Thread(target=serve_one, args=(c,)))
        threads[-1].start()
    for t in threads:
        t.join()
    srv.close()


def connect(address: str, port: int) -> tuple[smcr.SMCSocket, float]:
    t0 = time.monotonic()
    s = smcr.create_connection((address, port), timeout=TIMEOUT)
    return s, time.monotonic() - t0


def transfer(s: smcr.SMCSocket, took: float, total: int, seed: int, opened: str) -> None:
    row: dict[str, Any] = {"seed": seed, "opened": opened, "connect": took}
    t0 = time.monotonic()
    try:
        with s:
            row |= info(s)
            s.sendall(HEADER.pack(total, seed) + stream(seed, total))
            s.shutdown(socket.SHUT_WR)
            row["ok"] = recv_all(s) == stream(seed + 1, total)
    except Exception as e:  # (reported to the test, which fails on it)
        row |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
    row["transfer"] = time.monotonic() - t0
    emit(row)


def open_and_transfer(address: str, port: int, total: int, seed: int) -> None:
    try:
        s, took = connect(address, port)
    except Exception as e:  # (reported to the test, which fails on it)
        emit({"seed": seed, "opened": "under loss", "ok": False,
              "error": f"{type(e).__name__}: {e}"})  # fmt: skip
        return
    transfer(s, took, total, seed, "under loss")


def client(address: str, port: int, total: int, before: int, after: int) -> None:
    early = [connect(address, port) for _ in range(before)]
    emit({"up": before})
    sys.stdin.readline()
    threads = [threading.Thread(target=transfer, args=(s, took, total, seed, "before loss"))
               for seed, (s, took) in enumerate(early)]  # fmt: skip
    threads += [threading.Thread(target=open_and_transfer, args=(address, port, total, seed))
                for seed in range(before, before + after)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def sink(address: str) -> None:
    srv = smcr.create_server((address, 0))
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    srv.settimeout(TIMEOUT)
    c, _ = srv.accept()
    c.settimeout(TIMEOUT)
    row: dict[str, Any] = info(c)
    try:
        with c:
            data = recv_all(c)
        n, seed = HEADER.unpack(data[: HEADER.size])
        row |= {"bytes": len(data) - HEADER.size, "ok": data[HEADER.size :] == stream(seed, n)}
    except Exception as e:  # (reported to the test, which fails on it)
        row |= {"ok": False, "error": f"{type(e).__name__}: {e}"}
    srv.close()
    emit(row)


def sender(address: str, port: int, total: int) -> None:
    s = smcr.SMCSocket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * total)  # sendall returns at once
    s.settimeout(TIMEOUT)
    s.connect((address, port))
    emit({"up": 1})
    sys.stdin.readline()
    t0 = time.monotonic()
    with s:
        s.sendall(HEADER.pack(total, 7) + stream(7, total))
    emit({"sent": total, "took": time.monotonic() - t0})  # it exits now, much in flight


def main() -> None:
    role, *args = sys.argv[1:]
    if role == "server":
        server(args[0], int(args[1]))
    elif role == "sink":
        sink(args[0])
    elif role == "sender":
        sender(args[0], int(args[1]), int(args[2]))
    else:
        client(args[0], *map(int, args[1:5]))


if __name__ == "__main__":
    main()
