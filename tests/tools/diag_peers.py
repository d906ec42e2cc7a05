"""Peer programs for the observability tests: run as ``python diag_peers.py ROLE ...``.

``server [HOST]``, ``client PORT [HOST]`` (default 127.0.0.1).  Each prints one line
when it is ready (``ready PORT`` for servers) and then
waits for a line on standard input (``exit``: leave normally, so that its
counters are left behind; ``close``: close the SMC-R connections and wait again; a
client's ``talk``: 100 more round trips on each of them and one more connection to the
server, made by this process and so on the link group there is, which has its 100 too).
"""

from __future__ import annotations

import socket
import sys
import threading

import smcr


def _echo(conn: socket.socket) -> None:
    with conn:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass


def server(host: str = "127.0.0.1") -> None:
    """Echo every client; LISTEN stays open."""
    srv = smcr.create_server((host, 0))
    print(f"ready {srv.getsockname()[1]}", flush=True)

    def accept() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    _commands([])


def client(port: int, host: str = "127.0.0.1") -> None:
    """One SMC-R connection (100 round trips of 1000 bytes), one plain TCP connection (the
    server falls back: 0x03010000), then wait."""
    conn = smcr.create_connection((host, port))
    _round_trips(conn)
    plain = socket.create_connection((host, port))
    print(f"ready {conn.smc_info().mode} {plain.getsockname()[1]}", flush=True)
    _commands([conn], (host, port))


def _round_trips(conn: smcr.SMCSocket) -> None:
    for _ in range(100):
        conn.sendall(b"x" * 1000)
        got = 0
        while got < 1000:
            got += len(conn.recv(1000 - got))


def _commands(conns: list[smcr.SMCSocket], server_at: tuple[str, int] | None = None) -> None:
    for line in sys.stdin:
        if line.strip() == "close":
            for c in conns:
                c.close()
            print("closed", flush=True)
        elif line.strip() == "talk" and server_at is not None:
            conns.append(smcr.create_connection(server_at))
            for c in conns:
                _round_trips(c)
            print("talked", " ".join(c.smc_info().mode for c in conns), flush=True)
        elif line.strip() == "exit":
            return


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(*sys.argv[2:3])
    else:
        client(int(sys.argv[2]), *sys.argv[3:4])
