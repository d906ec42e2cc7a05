"""Run inside a fresh network namespace (``unshare --net``): the four opt-in combinations
over loopback with the pinned discovery map, and every TCP segment they sent, captured.

Prints one JSON object: per combination the peer flags both ends read, and per
segment its flags and whether it carried the SMC option.  ``--syncookies`` makes
the namespace answer every SYN with a cookie first (``tcp_syncookies=2``).
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from smcr.discovery.bpf import SocketFlags
from smcr.wire.tcpopt import find_smc_option, tcp_header_options

ETH_P_ALL = 0x0003


def segments(raw: socket.socket, ports: set[int]) -> list[dict[str, Any]]:
    """TCP segments of ``ports`` captured on lo (IPv4 only), in order."""
    found: list[dict[str, Any]] = []
    while True:
        try:
            frame, (_ifname, _proto, pkttype, *_rest) = raw.recvfrom(65535)
        except BlockingIOError:
            return found
        if pkttype == socket.PACKET_OUTGOING or frame[12:14] != b"\x08\x00":
            continue  # each segment on lo shows twice: keep the incoming copy
        ip = frame[14:]
        if ip[9] != 6:
            continue
        tcp = ip[(ip[0] & 0x0F) * 4 :]
        sport, dport = struct.unpack_from("!HH", tcp)
        if not {sport, dport} & ports:
            continue
        flags = tcp[13]
        found.append({"sport": sport, "dport": dport, "syn": bool(flags & 2),
                      "ack": bool(flags & 0x10), "fin": bool(flags & 1),
                      "payload": len(ip) - (ip[0] & 0x0F) * 4
                      - (tcp[12] >> 4) * 4,
                      "smc": find_smc_option(tcp_header_options(tcp), syn=True)})


def main() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    if "--syncookies" in sys.argv:
        with open("/proc/sys/net/ipv4/tcp_syncookies", "w") as f:
            f.write("2")
    flags = SocketFlags()
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    raw.bind(("lo", 0))
    raw.setblocking(False)
    results = []
    ports = set()
    for client_wants, server_wants in ((1, 1), (1, 0), (0, 1), (0, 0)):
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        if server_wants:
            flags.want(ls.fileno())
        ls.listen()
        port = ls.getsockname()[1]
        ports.add(port)
        c = socket.socket()
        if client_wants:
            flags.want(c.fileno())
        c.connect(("127.0.0.1", port))
        a, _ = ls.accept()
        c.sendall(b"data")
        assert a.recv(4) == b"data"
        results.append({"client_wants": client_wants, "server_wants": server_wants,
                        "port": port, "client_peer": flags.peer(c.fileno()),
                        "server_peer": flags.peer(a.fileno())})
        for s in (a, c, ls):
            s.close()
    # until both FINs of every connection are in (a wait for them, not a fixed sleep)
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10.0
    while sum(seg["fin"] for seg in found) < 2 * len(ports) and time.monotonic() < deadline:
        found += segments(raw, ports)
        time.sleep(0.01)
    print(json.dumps({"results": results, "segments": found}))


if __name__ == "__main__":
    main()
