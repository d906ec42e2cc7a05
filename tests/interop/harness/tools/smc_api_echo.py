"""A small program written for Linux's SMC socket API, run unchanged on a kernel with SMC
(the guest) and under ``smcr run`` (the host): both ends make their sockets with
``socket(AF_INET, SOCK_STREAM, IPPROTO_SMC)`` (Linux 6.11 on) or ``socket(AF_SMC,
SOCK_STREAM, SMCPROTO_SMC)``, and the listener asks for ``SMC_LIMIT_HS``.

``server --port P --api ipproto|af_smc``: prints ``listening``, accepts one client, reads to
EOF, sends back the SHA-256 of what it read, closes.  ``client --host H --port P --bytes N
--api ...``: sends N bytes, shuts down writing, reads the digest.  Both print one JSON line:
the bytes and digest, the ports, what the socket says of itself (family, protocol) and,
for the listener, ``SMC_LIMIT_HS`` as read back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import socket

AF_SMC = 43
SMCPROTO_SMC = 0
IPPROTO_SMC = 256
SOL_SMC = 286
SMC_LIMIT_HS = 1


def make_socket(api: str) -> socket.socket:
    if api == "ipproto":
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_SMC)
    # Python knows no AF_SMC addresses: the descriptor is used as an AF_INET socket
    raw = socket.socket(AF_SMC, socket.SOCK_STREAM, SMCPROTO_SMC)
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=raw.detach())


def about(sock: socket.socket) -> dict[str, int]:
    return {"so_domain": sock.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN),
            "so_protocol": sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)}


def server(a: argparse.Namespace) -> dict[str, object]:
    with make_socket(a.api) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.setsockopt(SOL_SMC, SMC_LIMIT_HS, 1)
        ls.bind(("0.0.0.0", a.port))
        ls.listen(8)
        limit_hs = ls.getsockopt(SOL_SMC, SMC_LIMIT_HS)
        print("listening", flush=True)
        ls.settimeout(a.timeout)
        conn, peer = ls.accept()
        with conn:
            conn.settimeout(a.timeout)
            digest, n = hashlib.sha256(), 0
            while data := conn.recv(65536):
                digest.update(data)
                n += len(data)
            conn.sendall(digest.hexdigest().encode())
            return {"bytes": n, "sha256": digest.hexdigest(), "peer_port": peer[1],
                    "limit_hs": limit_hs, "listener": about(ls), **about(conn)}


def client(a: argparse.Namespace) -> dict[str, object]:
    block = bytes(range(256)) * 256
    with make_socket(a.api) as s:
        s.settimeout(a.timeout)
        s.connect((a.host, a.port))
        digest, left = hashlib.sha256(), a.bytes
        while left:
            part = block[: min(left, len(block))]
            s.sendall(part)
            digest.update(part)
            left -= len(part)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while data := s.recv(100):
            answer += data
        return {"bytes": a.bytes, "sha256": digest.hexdigest(), "answer": answer.decode(),
                "local_port": s.getsockname()[1], **about(s)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["server", "client"])
    p.add_argument("--api", choices=["ipproto", "af_smc"], default="ipproto")
    p.add_argument("--host", default="10.99.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()
    print(json.dumps(server(a) if a.cmd == "server" else client(a)), flush=True)


if __name__ == "__main__":
    main()
