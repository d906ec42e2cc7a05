"""Hostile handshakes against one smcr server: clients that send a CLC Proposal and then
nothing, while legitimate smcr clients connect (issue #29's "1,000 Proposal-only clients").

What it reports: the legitimate clients' connect time (p50, p99, max) without and with the
flood, whether they all got SMC-R, and the server's RSS and descriptors before and during.
Each flooding Proposal is a real one (captured from an smcr client of a plain listener)
with a random system id and shm device id, so each is a first contact of a peer that
does not exist. Discovery is by peer list (``SMCR_PEERS``), so no BPF is needed.

    .venv/bin/python bench/proposal_flood.py --flood 1000 --clients 200
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

os.environ.update(SMCR_DISCOVERY="policy", SMCR_PEERS="127.0.0.0/8")

import smcr  # (after the environment above: a child process inherits it)

SERVER = """
import threading, smcr
srv = smcr.create_server(('127.0.0.1', 0), backlog=4096)
print(srv.getsockname()[1], flush=True)
def serve(s):
    try:
        s.recv(1); s.sendall(b'x'); s.recv(1)
    except OSError:
        pass
    finally:
        s.close()
while True:
    s, _ = srv.accept()
    threading.Thread(target=serve, args=(s,), daemon=True).start()
"""


def capture_proposal() -> bytes:
    """The first CLC message an smcr client of another process sends: its Proposal."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = subprocess.Popen([sys.executable, "-c",
                               "import smcr\nc = smcr.SMCSocket(); c.settimeout(3)\ntry:\n"
                               f"    c.connect(('127.0.0.1', {listener.getsockname()[1]}))\n"
                               "except OSError:\n    pass"])  # fmt: skip
    try:
        conn, _ = listener.accept()
        data = b""
        while len(data) < 8 or len(data) < int.from_bytes(data[5:7], "big"):
            data += conn.recv(4096)
        conn.close()
        return data[: int.from_bytes(data[5:7], "big")]
    finally:
        client.wait(10)
        listener.close()


def connects(port: int, n: int) -> tuple[list[float], dict[str, int]]:
    """``n`` sequential smcr clients: connect, a byte each way, close."""
    times: list[float] = []
    modes: dict[str, int] = {}
    for _ in range(n):
        start = time.perf_counter()
        with smcr.create_connection(("127.0.0.1", port), timeout=30) as s:
            times.append(time.perf_counter() - start)
            mode = s.smc_info().mode
            modes[mode] = modes.get(mode, 0) + 1
            s.sendall(b"h")
            s.recv(1)
    return sorted(times), modes


def summary(times: list[float], modes: dict[str, int]) -> str:
    p99 = times[max(0, int(len(times) * 0.99) - 1)]
    return (f"p50 {times[len(times) // 2] * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, "
            f"max {times[-1] * 1e3:.2f} ms, modes {modes}")  # fmt: skip


def footprint(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open descriptors) of process ``pid``."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flood", type=int, default=1000, help="Proposal-only clients")
    ap.add_argument("--clients", type=int, default=200, help="legitimate clients, each time")
    args = ap.parse_args()
    proposal = capture_proposal()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    flood: list[socket.socket] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        print("without the flood:", summary(*connects(port, args.clients)))
        rss0, fds0 = footprint(server.pid)
        for _ in range(args.flood):
            fake = proposal[:8] + os.urandom(8) + proposal[16:24] + os.urandom(8) + proposal[32:]
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(fake)
            flood.append(sock)
        time.sleep(0.5)
        print(f"with {args.flood} Proposal-only clients:", summary(*connects(port, args.clients)))
        rss1, fds1 = footprint(server.pid)
        print(f"server: RSS {rss0:.0f} -> {rss1:.0f} MiB, descriptors {fds0} -> {fds1}")
    finally:
        for sock in flood:
            sock.close()
        server.kill()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
