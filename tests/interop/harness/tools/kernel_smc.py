"""Guest side of the kernel SMC interop tests: kernel SMC (AF_SMC) or plain TCP.

Runs *inside* the QEMU guest (Debian 12, kernel 6.12), as ``python3 kernel_smc.py CMD``:

``setup``
    What ``shared/interop/tools/smc-setup.sh`` does once rxe0 exists: the pnet
    entry SMCNET eth0<->rxe0 (port 1) and the user EID ``SMC-KVM-TEST``, by
    generic netlink (the netlink of ``smcctl.py``, which is not copied here:
    this file is checked by the project's ruff and mypy).  Prints the UEID
    table as JSON.
``server --family smc|tcp --port P [--count K] [--mode echo|send] [--bytes N --seed S]``
    Accept K clients one after another (prints ``listening`` first).  ``echo``:
    echo each until EOF; ``send``: send N bytes of the pattern (seed S + i for
    the i-th connection), then close first (the close the server starts).
``client --family smc|tcp --host IP --port P [--count K] [--mode echo|send|pingpong] ...``
    K connections one after another.  ``echo``: send N bytes of the pattern (in
    a thread) while reading the echo back, then shut down writing and read to
    EOF; ``send``: read what the server sends until EOF; ``pingpong``: ITERS
    round trips of SIZE bytes, timed.
``--mode abort --aborter kernel|smcr`` (server and client)
    Abortive closes (``SO_LINGER`` 0), four connections in turn: ``mid`` (the
    aborter reads 1 MiB of what the other end keeps sending, then aborts once
    more has come in, unread),
    ``unread`` (the other end sends 64 bytes, the aborter aborts with them
    unread), ``idle`` (nothing sent; the aborter aborts) and ``after`` (a 64 KiB
    echo on the link group that carried the aborts).  The end that does not
    abort records how its send and its read ended (``EPIPE``, ``ECONNRESET``,
    ``EOF``...); the pattern is the host side's (``tests/interop/smc_host.py``).
``client --mode drain``
    Read what the server sends until EOF or an error, and say how it ended
    (the peer-gone tests: ``tests/interop/peer_gone.py``).
``socks``
    Every AF_SMC socket of the kernel (``smcss -a``): state, mode, ports.
``lgrs``
    The kernel's SMC-R link groups (``SMC_NETLINK_GET_LGR_SMCR``, what
    ``smcr linkgroup`` of smc-tools shows): id, role, type, connections and the
    SMC-Rv2 attributes (version, release, negotiated EID, peer host).

What server and client do is ``exchange_end.py`` beside this file, which smcr's end
on the host runs too.  Each prints one JSON line at the end: per connection, bytes and SHA-256 each
way, seconds and, for AF_SMC, the connection's row of ``smc_diag`` (what
``smcss`` shows: mode, fallback reason and the peer's diagnosis, and for
SMC-R the link: device, GIDs, role; the connection's token and buffer
sizes; and the link groups as ``lgrs`` lists them), taken while the socket
is open.

The pattern is ``random.Random(seed).randbytes``, made and hashed in
64 KiB pieces (so hundreds of MiB need no memory, and generating it costs
little even under TCG); the host side (``tests/interop/smc_host.py``) makes
the same.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the project's mypy reads this file as part of the tests package
    from tests.interop.harness.tools.exchange_end import Stack, add_exchange_args, serve
    from tests.interop.harness.tools.exchange_end import client as exchange_client
else:  # in the guest: the shared end is beside this file, the path's first entry
    from exchange_end import Stack, add_exchange_args, serve
    from exchange_end import client as exchange_client

AF_SMC = 43
NETLINK_GENERIC, NETLINK_SOCK_DIAG = 16, 4
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 1, 4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
GENL_ID_CTRL, CTRL_CMD_GETFAMILY = 16, 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
SMC_NETLINK_GET_LGR_SMCR = 2
SMC_NETLINK_DUMP_UEID, SMC_NETLINK_ADD_UEID, SMC_NLA_EID_TABLE_ENTRY = 9, 10, 1
SMC_GEN_LGR_SMCR = 2
# SMC_GEN_LGR_SMCR attributes, and those of its nest SMC_NLA_LGR_R_V2_COMMON
LGR_ID, LGR_ROLE, LGR_TYPE, LGR_CONNS_NUM, LGR_V2_COMMON = 1, 2, 3, 6, 7
LGR_V2_VER, LGR_V2_REL, LGR_V2_NEG_EID, LGR_V2_PEER_HOST = 0, 1, 3, 4
LGR_TYPES = {0: "NONE", 1: "SINGLE", 2: "SYMMETRIC", 3: "ASYMMETRIC_PEER",
             4: "ASYMMETRIC_LOCAL"}  # fmt: skip
SMC_PNETID_ADD = 2
SMC_PNETID_NAME, SMC_PNETID_ETHNAME, SMC_PNETID_IBNAME, SMC_PNETID_IBPORT = 1, 2, 3, 4
SOCK_DIAG_BY_FAMILY = 20
SMC_DIAG_CONNINFO, SMC_DIAG_LGRINFO, SMC_DIAG_FALLBACK = 1, 2, 5
DIAG_MODES = {0: "SMCR", 1: "FALLBACK_TCP", 2: "SMCD"}
ROLES = {0: "CLNT", 1: "SERV"}
UEID = "SMC-KVM-TEST"


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


def pnet_add(eth: str, ib: str) -> dict[str, Any]:
    """pnet SMCNET ``eth``<->``ib`` port 1 (kept if already there)."""
    pnet = genl_family("SMC_PNETID")
    entry = (nla(SMC_PNETID_NAME, b"SMCNET\0") + nla(SMC_PNETID_ETHNAME, eth.encode() + b"\0")
             + nla(SMC_PNETID_IBNAME, ib.encode() + b"\0")
             + nla(SMC_PNETID_IBPORT, b"\x01"))  # fmt: skip
    try:
        genl(pnet, SMC_PNETID_ADD, entry)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
    return {"pnet": ["SMCNET", eth, ib]}


def setup() -> dict[str, Any]:
    """pnet SMCNET eth0<->rxe0 port 1 and UEID SMC-KVM-TEST (each kept if already there)."""
    pnet_add("eth0", "rxe0")
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


def lgrs() -> dict[str, Any]:
    """The kernel's SMC-R link groups (module docstring)."""
    gen = genl_family("SMC_GEN_NETLINK")
    out: list[dict[str, Any]] = []
    for body in genl(gen, SMC_NETLINK_GET_LGR_SMCR, dump=True):
        for kind, nest in attrs(body):
            if kind != SMC_GEN_LGR_SMCR:
                continue
            lgr: dict[str, Any] = {}
            for k, v in attrs(nest):
                if k == LGR_ID:
                    lgr["id"] = struct.unpack_from("=I", v)[0]
                elif k == LGR_ROLE:
                    lgr["role"] = ROLES.get(v[0], str(v[0]))
                elif k == LGR_TYPE:
                    lgr["type"] = LGR_TYPES.get(v[0], str(v[0]))
                elif k == LGR_CONNS_NUM:
                    lgr["conns"] = struct.unpack_from("=I", v)[0]
                elif k == LGR_V2_COMMON:
                    for k2, v2 in attrs(v):
                        if k2 == LGR_V2_VER:
                            lgr["version"] = v2[0]
                        elif k2 == LGR_V2_REL:
                            lgr["release"] = v2[0]
                        elif k2 == LGR_V2_NEG_EID:
                            lgr["eid"] = v2.rstrip(b"\0").decode(errors="replace").rstrip()
                        elif k2 == LGR_V2_PEER_HOST:
                            lgr["peer_host"] = v2.rstrip(b"\0").decode(errors="replace").rstrip()
            out.append(lgr)
    return {"lgrs": out}


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


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
            elif kind == SMC_DIAG_LGRINFO and len(data) >= 147:  # struct smc_diag_lgrinfo
                out["link"] = {"link_id": data[0], "ibname": _text(data[1:65]),
                               "ibport": data[65], "gid": _text(data[66:106]),
                               "peer_gid": _text(data[106:146]),
                               "role": ROLES.get(data[146], str(data[146]))}  # fmt: skip
            elif kind == SMC_DIAG_CONNINFO and len(data) >= 16:  # struct smc_diag_conninfo
                token, sndbuf, rmbe, peer_rmbe = struct.unpack_from("=IIII", data)
                out["conn"] = {"token": token, "sndbuf": sndbuf, "rmbe": rmbe,
                               "peer_rmbe": peer_rmbe}  # fmt: skip
        return out
    return None


CURSORS = ("rx_prod", "rx_cons", "tx_prod", "tx_cons")
CURSORS_AFTER_FLAGS = ("tx_prep", "tx_sent", "tx_fin")


def conn_cursors(data: bytes) -> dict[str, Any]:
    """The cursors and flags of a ``struct smc_diag_conninfo`` (``smcss -D``): each cursor
    as ``[wrap, count]`` (``struct smc_diag_cursor``: reserved u16, wrap u16, count u32),
    the four flag bytes (rx producer and connection state, tx producer and connection
    state) between the first four cursors and the last three."""
    out: dict[str, Any] = {}
    off = 16
    for name in CURSORS:
        out[name] = list(struct.unpack_from("=HI", data, off + 2))
        off += 8
    out["flags"] = list(data[off:off + 4])
    off += 4
    for name in CURSORS_AFTER_FLAGS:
        if off + 8 <= len(data):
            out[name] = list(struct.unpack_from("=HI", data, off + 2))
        off += 8
    return out


def socks() -> dict[str, Any]:
    """Every AF_SMC socket the kernel has (``smcss -a``): state, mode, ports, and for a
    connection its cursors (:func:`conn_cursors`: what to look at when a transfer stalls)."""
    ext = 1 << (SMC_DIAG_CONNINFO - 1)
    req = struct.pack("=BBBB", AF_SMC, 0, 0, ext) + bytes(48)
    rows = []
    for row in request(NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_DUMP, req):
        _family, state, mode, _shut = struct.unpack_from("=BBBB", row)
        sport, dport = struct.unpack_from(">HH", row, 4)
        rec: dict[str, Any] = {"state": state, "mode": DIAG_MODES.get(mode, str(mode)),
                               "sport": sport, "dport": dport}  # fmt: skip
        for kind, data in attrs(row[64:]):
            if kind == SMC_DIAG_CONNINFO and len(data) >= 52:
                rec.update(conn_cursors(data))
        rows.append(rec)
    return {"socks": rows}


def make_socket(family: str) -> socket.socket:
    if family == "smc":  # SMCPROTO_SMC; Python knows no AF_SMC addresses: use it as AF_INET
        raw = socket.socket(AF_SMC, socket.SOCK_STREAM, 0)
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=raw.detach())
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)


def diag_of(sock: socket.socket, family: str) -> dict[str, Any] | None:
    """The socket's ``smc_diag`` row, and for SMC-R the kernel's link groups at that time."""
    if family != "smc":
        return None
    diag = smc_diag(sock.getsockname()[1], sock.getpeername()[1])
    if diag is not None and diag["mode"] == "SMCR":
        diag["lgrs"] = lgrs()["lgrs"]
    return diag


def kernel_stack(family: str) -> Stack:
    """This end: AF_SMC (kernel SMC) or plain TCP sockets, described by ``smc_diag``."""

    def connect(a: argparse.Namespace) -> socket.socket:
        s = make_socket(family)
        s.settimeout(a.timeout)
        try:
            s.connect((a.host, a.port))
        except BaseException:
            s.close()
            raise
        return s

    return Stack("kernel", "diag", lambda sock: diag_of(sock, family), connect)


def server(a: argparse.Namespace) -> dict[str, Any]:
    with make_socket(a.family) as ls:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("0.0.0.0", a.port))
        ls.listen(16)
        print("listening", flush=True)
        return serve(ls, a, kernel_stack(a.family))


def client(a: argparse.Namespace) -> dict[str, Any]:
    return exchange_client(a, kernel_stack(a.family))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["setup", "server", "client", "lgrs", "socks", "pnet"])
    p.add_argument("--eth", default="eth0")  # pnet: the net device and the RNIC
    p.add_argument("--ib", default="rxe0")
    p.add_argument("--family", choices=["smc", "tcp"], default="smc")
    add_exchange_args(p, "10.99.0.1", ["echo", "send", "pingpong", "abort", "drain", "hold"])
    a = p.parse_args()
    if a.cmd in ("server", "client"):
        print(json.dumps({"pid": os.getpid()}), flush=True)  # for the tests that kill it
    commands: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
        "setup": lambda _a: setup(), "server": server, "client": client,
        "lgrs": lambda _a: lgrs(), "socks": lambda _a: socks(),
        "pnet": lambda a: pnet_add(a.eth, a.ib),
    }  # fmt: skip
    print(json.dumps(commands[a.cmd](a)), flush=True)


if __name__ == "__main__":
    main()
