"""One end of the no-RNIC tests (``tests/socket/test_no_rnic.py``), run as a process of its
own with its ``SMCR_*`` environment: ``server PORTFILE`` echoes one connection;
``client PORT N`` sends N pattern bytes, reads the echo; both print their ``smc_info()``
and what they moved as one JSON line."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import sys
import threading
from pathlib import Path

import smcr


def main() -> None:
    role = sys.argv[1]
    if role == "server":
        srv = smcr.create_server(("127.0.0.1", 0))
        Path(sys.argv[2]).write_text(str(srv.getsockname()[1]))
        conn, _ = srv.accept()
        conn.settimeout(30)
        moved = 0
        while data := conn.recv(65536):
            conn.sendall(data)
            moved += len(data)
        info = conn.smc_info()
        conn.close()
        print(json.dumps({"mode": info.mode, "local": info.local_code,
                          "peer": info.peer_code, "echoed": moved}))  # fmt: skip
        return
    port, n = int(sys.argv[2]), int(sys.argv[3])
    data = random.Random(n).randbytes(n)
    sock = smcr.create_connection(("127.0.0.1", port), timeout=30)

    def send() -> None:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    got = bytearray()
    while chunk := sock.recv(65536):
        got += chunk
    sender.join()
    info = sock.smc_info()
    sock.close()
    print(json.dumps({"mode": info.mode, "local": info.local_code, "peer": info.peer_code,
                      "intact": hashlib.sha256(got).digest() == hashlib.sha256(data).digest()}))


if __name__ == "__main__":
    main()
