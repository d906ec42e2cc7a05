"""smcr's end of the discovery interop tests: one SMCSocket connection in netns ``smcnet``.

``python -m tests.interop.smc_host server --port P`` accepts one client on
10.99.0.1 (prints ``{"listening": P}`` first) and echoes until EOF;
``python -m tests.interop.smc_host client --host IP --port P --bytes N --seed S``
sends N bytes of the seeded pattern (in a thread) while reading the echo back.
The guest's ``harness/tools/kernel_smc.py`` is the other end, with the same
pattern.  Both print one JSON line at the end: the discovery mode in force,
``smc_info()`` right after connect/accept, and bytes and SHA-256 each way.

The process joins the namespace by ``setns`` (:func:`smcr.tools.netns.enter_netns`),
not ``ip netns exec``: that one remounts ``/sys``, and with it ``/sys/fs/bpf``
where ``smcr enable`` pinned the discovery map.  ``SMCR_RNIC=roce`` (set by the
test) makes smcr use its RoCE RNIC on the connection's address, as it must
against the guest; ``SMCR_DISCOVERY=off`` is the control without the option.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket
import threading
from typing import Any

import smcr
from smcr import discovery
from smcr.socket import SMCSocket
from smcr.tools.netns import enter_netns

NETNS = "smcnet"
HOST_IP = "10.99.0.1"
CHUNK = 65536


def pattern(seed: int, n: int) -> bytes:
    """The guest tool's pattern: SHA-256 blocks of the seed and a counter."""
    blocks = (n + 31) // 32
    return b"".join(hashlib.sha256(b"%d:%d" % (seed, i)).digest() for i in range(blocks))[:n]


def info(sock: SMCSocket) -> dict[str, Any]:
    i = sock.smc_info()
    return {"mode": i.mode, "local_code": i.local_code, "peer_code": i.peer_code}


def server(a: argparse.Namespace) -> dict[str, Any]:
    srv = smcr.create_server((HOST_IP, a.port))
    srv.settimeout(a.timeout)
    print(json.dumps({"listening": a.port}), flush=True)
    conn, _addr = srv.accept()
    srv.close()
    with conn:
        conn.settimeout(a.timeout)
        got = info(conn)
        h, total = hashlib.sha256(), 0
        while data := conn.recv(CHUNK):
            h.update(data)
            total += len(data)
            conn.sendall(data)
    return {"info": got, "received": total, "received_sha256": h.hexdigest()}


def client(a: argparse.Namespace) -> dict[str, Any]:
    data = pattern(a.seed, a.bytes)
    with smcr.create_connection((a.host, a.port), timeout=a.timeout) as s:
        got = info(s)
        failed: list[BaseException] = []

        def send() -> None:
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
            except BaseException as exc:  # reported with the result
                failed.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        h, total = hashlib.sha256(), 0
        while chunk := s.recv(CHUNK):
            h.update(chunk)
            total += len(chunk)
        sender.join(a.timeout)
    return {"info": got, "sent": len(data), "sent_sha256": hashlib.sha256(data).hexdigest(),
            "received": total, "received_sha256": h.hexdigest(),
            "send_error": repr(failed[0]) if failed else None}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["server", "client"])
    p.add_argument("--host", default="10.99.0.11")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()
    enter_netns(NETNS)
    result = server(a) if a.cmd == "server" else client(a)
    result["discovery"] = discovery.current().mode
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
