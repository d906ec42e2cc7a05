"""Guest side of the discovery interop tests: kernel SMC (AF_SMC) or plain TCP, one connection.

Runs *inside* the QEMU guest (Debian 12, kernel 6.12), as ``python3 kernel_smc.py CMD``:

``setup``
    What ``shared/interop/tools/smc-setup.sh`` does once rxe0 exists: the pnet
    entry SMCNET eth0<->rxe0 (port 1) and the user EID ``SMC-KVM-TEST``, by
    generic netlink (the netlink of ``smcctl.py``, which is not copied here:
    this file is checked by the project's ruff and mypy).  Prints the UEID
    table as JSON.
``server --family smc|tcp --port P``
    Accept one client (prints ``listening`` first), echo until EOF.
``client --family smc|tcp --host IP --port P --bytes N --seed S``
    Send N bytes of a seeded pattern (in a thread) while reading the echo back.

Both print one JSON line at the end: bytes and SHA-256 each way and, for
AF_SMC, the connection's row of ``smc_diag`` (what ``smcss`` shows: mode,
fallback reason and the peer's diagnosis), taken while the socket is open.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import socket
import struct
import threading
from typing import Any

AF_SMC = 43
NETLINK_GENERIC, NETLINK_SOCK_DIAG = 16, 4
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 1, 4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
GENL_ID_CTRL, CTRL_CMD_GETFAMILY = 16, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
SMC_NETLINK_DUMP_UEID, SMC_NETLINK_ADD_UEID, SMC_NLA_EID_TABLE_ENTRY = 9, 10, 1
SMC_PNETID_ADD = 2
SMC_PNETID_NAME, SMC_PNETID_ETHNAME, SMC_PNETID_IBNAME, SMC_PNETID_IBPORT = 1, 2, 3, 4
SOCK_DIAG_BY_FAMILY = 20
SMC_DIAG_CONNINFO, SMC_DIAG_LGRINFO, SMC_DIAG_FALLBACK = 1, 2, 5
DIAG_MODES = {0: "SMCR", 1: "FALLBACK_TCP", 2: "SMCD"}
UEID = "SMC-KVM-TEST"
CHUNK = 65536


def nla(kind: int, data: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    n = 4 + len(data)
    return struct.pack("=HH", n, kind) + data + bytes(-n % 4)


def attrs(buf: bytes) -> list[tuple[int, bytes]]:
    """The (type, payload) of each attribute in ``buf``."""
    out, i = [], 0
    while i + 4 <= len(buf):
        n, kind = struct.unpack_from("=HH", buf, i)
        if n < 4:
            break
        out.append((kind & 0x3FFF, buf[i + 4 : i + n]))
        i += (n + 3) & ~3
    return out


def request(proto: int, mtype: int, flags: int, payload: bytes) -> list[bytes]:
    """One netlink request; the bodies of its answers (raises OSError on an error answer)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, proto) as s:
        s.bind((0, 0))
        s.settimeout(10.0)
        s.send(struct.pack("=IHHII", 16 + len(payload), mtype, flags | NLM_F_REQUEST, 1, 0)
               + payload)  # fmt: skip
        bodies: list[bytes] = []
        while True:
            data = s.recv(1 << 20)
            i = 0
            while i + 16 <= len(data):
                n, kind = struct.unpack_from("=IH", data, i)
                body = data[i + 16 : i + n]
                i += (n + 3) & ~3
                if kind == NLMSG_DONE:
                    return bodies
                if kind == NLMSG_ERROR:
                    err = struct.unpack_from("=i", body)[0]
                    if err:
                        raise OSError(-err, f"netlink: {errno.errorcode.get(-err, err)}")
                    return bodies
                bodies.append(body)


def genl_family(name: str) -> int:
    payload = struct.pack("=BBH", CTRL_CMD_GETFAMILY, 1, 0)
    payload += nla(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0")
    for body in request(NETLINK_GENERIC, GENL_ID_CTRL, NLM_F_ACK, payload):
        for kind, data in attrs(body[4:]):
            if kind == CTRL_ATTR_FAMILY_ID:
                return int(struct.unpack_from("=H", data)[0])
    raise RuntimeError(f"generic netlink family {name} not found (module smc loaded?)")


def genl(family: int, cmd: int, payload: bytes = b"", dump: bool = False) -> list[bytes]:
    flags = NLM_F_ACK | (NLM_F_DUMP if dump else 0)
    hdr = struct.pack("=BBH", cmd, 1, 0)
    return [b[4:] for b in request(NETLINK_GENERIC, family, flags, hdr + payload)]


def setup() -> dict[str, Any]:
    """pnet SMCNET eth0<->rxe0 port 1 and UEID SMC-KVM-TEST (each kept if already there)."""
    pnet = genl_family("SMC_PNETID")
    entry = (nla(SMC_PNETID_NAME, b"SMCNET\0") + nla(SMC_PNETID_ETHNAME, b"eth0\0")
             + nla(SMC_PNETID_IBNAME, b"rxe0\0") + nla(SMC_PNETID_IBPORT, b"\x01"))  # fmt: skip
    try:
        genl(pnet, SMC_PNETID_ADD, entry)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
    gen = genl_family("SMC_GEN_NETLINK")
    eid = UEID.encode().ljust(32, b" ") + b"\0"
    try:
        genl(gen, SMC_NETLINK_ADD_UEID, nla(SMC_NLA_EID_TABLE_ENTRY, eid))
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
    ueids = [data.rstrip(b"\0").decode().rstrip() for body in genl(gen, SMC_NETLINK_DUMP_UEID,
             dump=True) for _kind, data in attrs(body)]  # fmt: skip
    return {"ueids": ueids}


def smc_diag(local_port: int, peer_port: int) -> dict[str, Any] | None:
    """The ``smc_diag`` row of the AF_SMC socket with these ports (``smcss``), or None."""
    ext = (1 << (SMC_DIAG_CONNINFO - 1)) | (1 << (SMC_DIAG_LGRINFO - 1))
    ext |= 1 << (SMC_DIAG_FALLBACK - 1)
    req = struct.pack("=BBBB", AF_SMC, 0, 0, ext) + bytes(48)
    for row in request(NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, req):
        _family, state, mode, _shut = struct.unpack_from("=BBBB", row)
        sport, dport = struct.unpack_from(">HH", row, 4)
        if (sport, dport) != (local_port, peer_port):
            continue
        out: dict[str, Any] = {"state": state, "mode": DIAG_MODES.get(mode, str(mode))}
        for kind, data in attrs(row[64:]):
            if kind == SMC_DIAG_FALLBACK and len(data) >= 8:
                out["fallback_reason"], out["peer_diagnosis"] = struct.unpack_from("=II", data)
        return out
    return None


def pattern(seed: int, n: int) -> bytes:
    """``n`` bytes of SHA-256 blocks of the seed and a counter (the host side makes the same)."""
    blocks = (n + 31) // 32
    return b"".join(hashlib.sha256(b"%d:%d" % (seed, i)).digest() for i in range(blocks))[:n]


def make_socket(family: str) -> socket.socket:
    if family == "smc":  # SMCPROTO_SMC; Python knows no AF_SMC addresses: use it as AF_INET
        raw = socket.socket(AF_SMC, socket.SOCK_STREAM, 0)
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=raw.detach())
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def diag_of(sock: socket.socket, family: str) -> dict[str, Any] | None:
    if family != "smc":
        return None
    return smc_diag(sock.getsockname()[1], sock.getpeername()[1])


def server(a: argparse.Namespace) -> dict[str, Any]:
    with make_socket(a.family) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("0.0.0.0", a.port))
        ls.listen(4)
        ls.settimeout(a.timeout)
        print("listening", flush=True)
        conn, _peer = ls.accept()
    with conn:
        conn.settimeout(a.timeout)
        diag = diag_of(conn, a.family)
        h, total = hashlib.sha256(), 0
        while data := conn.recv(CHUNK):
            h.update(data)
            total += len(data)
            conn.sendall(data)
        return {"diag": diag, "received": total, "received_sha256": h.hexdigest()}


def client(a: argparse.Namespace) -> dict[str, Any]:
    data = pattern(a.seed, a.bytes)
    with make_socket(a.family) as s:
        s.settimeout(a.timeout)
        s.connect((a.host, a.port))
        diag = diag_of(s, a.family)
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
        return {"diag": diag, "sent": len(data), "sent_sha256": hashlib.sha256(data).hexdigest(),
                "received": total, "received_sha256": h.hexdigest(),
                "send_error": repr(failed[0]) if failed else None}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["setup", "server", "client"])
    p.add_argument("--family", choices=["smc", "tcp"], default="smc")
    p.add_argument("--host", default="10.99.0.1")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()
    result = setup() if a.cmd == "setup" else server(a) if a.cmd == "server" else client(a)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
