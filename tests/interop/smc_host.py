"""smcr's end of the kernel SMC interop tests: SMCSocket connections in netns ``smcnet``.

``python -m tests.interop.smc_host server --port P [--count K] [--mode echo|send]``
accepts K clients one after another on 10.99.0.1 (prints ``{"listening": P}``
first): ``echo`` echoes each until EOF, ``send`` sends N bytes of the pattern
and closes first.
``python -m tests.interop.smc_host client --host IP --port P [--count K]
[--mode echo|send|pingpong] [--bytes N --seed S] [--iters I --size Z]`` makes K
connections one after another: ``echo`` sends N bytes of the seeded pattern (in
a thread) while reading the echo back, ``send`` reads until EOF, ``pingpong``
times I round trips of Z bytes.
``--mode abort --aborter smcr|kernel`` runs the abort scenarios of
``kernel_smc.py`` (``mid``, ``unread``, ``idle``, then an ``after`` echo), the
same on both ends.
The guest's ``harness/tools/kernel_smc.py`` is the other end, with the same
modes and the same pattern (``random.Random(seed + i).randbytes(N)`` for the
i-th connection, made in pieces).  Both print one JSON line at the end: per
connection ``smc_info()`` right after connect/accept (and for SMC-R the link
group as smcr's engine holds it: version, negotiated EID, peer GID and host),
bytes and SHA-256 each way and seconds; then the discovery mode in force and the
RoCE RNIC's counters (packets, ICRC errors).

The process joins the namespace by ``setns`` (:func:`smcr.tools.netns.enter_netns`),
not ``ip netns exec``: that one remounts ``/sys``, and with it ``/sys/fs/bpf``
where ``smcr enable`` pinned the discovery map.  ``SMCR_RNIC=roce`` (set by the
test) makes smcr use its RoCE RNIC on the connection's address, as it must
against the guest; ``SMCR_DISCOVERY=off`` is the control without the option;
``SMCR_UEID_FILE`` names the UEID table the test gives smcr.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import ipaddress
import json
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import smcr
from smcr import discovery
from smcr.socket import SMCSocket
from smcr.stack.runtime import get_stack
from smcr.tools.netns import enter_netns

NETNS = "smcnet"
HOST_IP = "10.99.0.1"
CHUNK = 65536
ABORT_SCENARIOS = ("mid", "unread", "idle", "after")
ABORT_READ = 1 << 20  # what the aborter reads in ``mid`` before it aborts


def chunks(seed: int, n: int) -> Iterator[bytes]:
    """The pattern, as both ends make it: ``random.Random(seed).randbytes`` in pieces of
    :data:`CHUNK`, each a whole number of the generator's 32-bit words, so that any
    ``n`` bytes are the start of any longer run."""
    rng = random.Random(seed)
    while n > 0:
        k = min(CHUNK, n)
        yield rng.randbytes(k + (-k % 4))[:k]  # whole words: a prefix of any longer run
        n -= k


def pattern(seed: int, n: int) -> bytes:
    """The first ``n`` bytes of the pattern, all at once (for a few MiB; :func:`digest`
    for more)."""
    return b"".join(chunks(seed, n))


def digest(seed: int, n: int) -> str:
    """SHA-256 of ``n`` bytes of the pattern, made piece by piece."""
    h = hashlib.sha256()
    for piece in chunks(seed, n):
        h.update(piece)
    return h.hexdigest()


def info(sock: SMCSocket) -> dict[str, Any]:
    """``smc_info()``, and for SMC-R the link group as the engine holds it."""
    i = sock.smc_info()
    out: dict[str, Any] = {"mode": i.mode, "local_code": i.local_code, "peer_code": i.peer_code}
    if i.mode != "SMCR":
        return out
    out |= {"version": i.version, "lgr_id": i.lgr_id, "first_contact": i.first_contact,
            "rmb_size": i.rmb_size, "peer_rmb_size": i.peer_rmb_size}  # fmt: skip
    stack = get_stack(ipaddress.ip_address(sock.getsockname()[0]))
    with stack.lock:
        lgr = stack.engine.lgrs[i.lgr_id]
        link = lgr.links[0]
        out["lgr"] = {
            "version": lgr.version, "role": lgr.role.name,
            "eid": lgr.terms.eid.decode().rstrip() if lgr.terms else None,
            "peer_host": lgr.peer_hostname.decode(errors="replace").rstrip(),
            "peer_release": lgr.peer_release, "gid": stack.engine.identity.gid.hex(),
            "peer_gid": link.peer_gid.hex(), "qpn": link.qpn, "peer_qpn": link.peer_qpn,
            "mtu": link.mtu,
        }  # fmt: skip
    return out


def drain(sock: SMCSocket) -> tuple[int, str]:
    """Read until EOF: how many bytes, and their SHA-256."""
    h, total = hashlib.sha256(), 0
    while data := sock.recv(CHUNK):
        h.update(data)
        total += len(data)
    return total, h.hexdigest()


def send_pattern(sock: SMCSocket, seed: int, n: int) -> str:
    """Send ``n`` bytes of the pattern; their SHA-256."""
    h = hashlib.sha256()
    for piece in chunks(seed, n):
        h.update(piece)
        sock.sendall(piece)
    return h.hexdigest()


def outcome(exc: BaseException | None) -> str:
    """How a send or a read ended: ``ok``, or the errno's name (``timeout``)."""
    if exc is None:
        return "ok"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return repr(exc)


def read_outcome(sock: SMCSocket) -> tuple[str, int]:
    """Read until EOF or an error: how it ended, and the bytes read."""
    total = 0
    try:
        while piece := sock.recv(CHUNK):
            total += len(piece)
    except OSError as exc:
        return outcome(exc), total
    return "EOF", total


def abort_one(sock: SMCSocket, a: argparse.Namespace, i: int) -> dict[str, Any]:
    """This end's part of abort scenario ``i``, as ``kernel_smc.py``'s ``abort_one``."""
    scenario = ABORT_SCENARIOS[i % len(ABORT_SCENARIOS)]
    out: dict[str, Any] = {"scenario": scenario}
    t0 = time.perf_counter()
    if a.aborter == "smcr":  # this end aborts
        if scenario == "mid":
            got = 0
            while got < ABORT_READ and (piece := sock.recv(CHUNK)):
                got += len(piece)
            out["received"] = got  # and more is coming: abort with it unread
            out["readable"] = bool(select.select([sock], [], [], a.timeout)[0])
        elif scenario == "unread":
            out["readable"] = bool(select.select([sock], [], [], a.timeout)[0])
        else:
            time.sleep(0.5)  # idle: the other end is blocked in its read
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        out["aborted"] = True
    else:  # the kernel aborts: how do our send and read end?
        sent, failed = 0, None
        if scenario in ("mid", "unread"):
            try:
                for piece in chunks(a.seed + i, a.bytes if scenario == "mid" else 64):
                    sock.sendall(piece)
                    sent += len(piece)
            except OSError as exc:
                failed = exc
        out |= {"sent": sent, "send": outcome(failed) if scenario != "idle" else None}
        out["read"], out["received"] = read_outcome(sock)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # what is left pending
        out["so_error"] = errno.errorcode.get(err, str(err)) if err else None
    out["seconds"] = time.perf_counter() - t0
    return out


def serve_one(conn: SMCSocket, a: argparse.Namespace, i: int) -> dict[str, Any]:
    conn.settimeout(a.timeout)
    got = info(conn)
    t0 = time.perf_counter()
    if a.mode == "abort" and ABORT_SCENARIOS[i % len(ABORT_SCENARIOS)] != "after":
        return {"info": got} | abort_one(conn, a, i)
    if a.mode == "send":
        sent = send_pattern(conn, a.seed + i, a.bytes)
        conn.shutdown(socket.SHUT_WR)
        total, digest = drain(conn)
        return {"info": got, "sent": a.bytes, "sent_sha256": sent, "received": total,
                "received_sha256": digest, "seconds": time.perf_counter() - t0}  # fmt: skip
    h, total = hashlib.sha256(), 0
    while data := conn.recv(CHUNK):
        h.update(data)
        total += len(data)
        conn.sendall(data)
    return {"info": got, "received": total, "received_sha256": h.hexdigest(),
            "seconds": time.perf_counter() - t0}  # fmt: skip


def server(a: argparse.Namespace) -> dict[str, Any]:
    srv = smcr.create_server((HOST_IP, a.port))
    srv.settimeout(a.timeout)
    print(json.dumps({"listening": a.port}), flush=True)
    conns = []
    try:
        for i in range(a.count):
            conn, _addr = srv.accept()
            with conn:
                conns.append(serve_one(conn, a, i))
    finally:
        srv.close()
    return {"conns": conns}


def client_one(a: argparse.Namespace, i: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    with smcr.create_connection((a.host, a.port), timeout=a.timeout) as s:
        out: dict[str, Any] = {"connect_seconds": time.perf_counter() - t0, "info": info(s)}
        t0 = time.perf_counter()
        if a.mode == "abort" and ABORT_SCENARIOS[i % len(ABORT_SCENARIOS)] != "after":
            return out | abort_one(s, a, i)
        if a.mode == "abort":  # after the aborts: a short echo
            a = argparse.Namespace(**(vars(a) | {"mode": "echo", "bytes": CHUNK}))
        if a.mode == "send":
            out["received"], out["received_sha256"] = drain(s)
        elif a.mode == "pingpong":
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            msg = bytes(range(256)) * (a.size // 256) + bytes(a.size % 256)
            ok = 0
            for k in range(a.iters):
                if k and a.pause:  # idle: the links' keepalive runs
                    time.sleep(a.pause)
                s.sendall(msg)
                got = b""
                while len(got) < a.size:
                    piece = s.recv(a.size - len(got))
                    if not piece:
                        break
                    got += piece
                ok += got == msg
            out |= {"iters": a.iters, "size": a.size, "echoed_intact": ok,
                    "pingpong_seconds": time.perf_counter() - t0}  # fmt: skip
            s.shutdown(socket.SHUT_WR)
            out["received"], out["received_sha256"] = drain(s)
        else:
            failed: list[BaseException] = []
            sent: list[str] = []

            def send() -> None:
                try:
                    sent.append(send_pattern(s, a.seed + i, a.bytes))
                    s.shutdown(socket.SHUT_WR)
                except BaseException as exc:  # reported with the result
                    failed.append(exc)

            sender = threading.Thread(target=send)
            sender.start()
            out["received"], out["received_sha256"] = drain(s)
            sender.join(a.timeout)
            out |= {"sent": a.bytes, "sent_sha256": sent[0] if sent else None,
                    "send_error": repr(failed[0]) if failed else None}  # fmt: skip
        out["seconds"] = time.perf_counter() - t0
    return out


def client(a: argparse.Namespace) -> dict[str, Any]:
    return {"conns": [client_one(a, i) for i in range(a.count)]}


def rnic_stats() -> dict[str, int] | None:
    """The RoCE RNIC's counters on 10.99.0.1 (None if smcr never opened it)."""
    from smcr.stack import runtime  # noqa: PLC0415

    for stack in runtime._stacks.values():
        stats = getattr(stack.device, "stats", None)
        if isinstance(stats, dict):
            return dict(stats)
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["server", "client"])
    p.add_argument("--host", default="10.99.0.11")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--mode", choices=["echo", "send", "pingpong", "abort"], default="echo")
    p.add_argument("--aborter", choices=["kernel", "smcr"], default="smcr")
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--size", type=int, default=1)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)
    a = p.parse_args()
    enter_netns(NETNS)
    result = server(a) if a.cmd == "server" else client(a)
    result["discovery"] = discovery.current().mode
    result["rnic"] = rnic_stats()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
