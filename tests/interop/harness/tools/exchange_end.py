"""One end of an interop exchange, the same code on both: the guest's kernel SMC end
(``kernel_smc.py``, beside this file, run in the guest) and smcr's ends, on the host
(``tests/interop/smc_host.py``) and over verbs in a guest (``smcr_end.py``).

What an end does is the same whichever stack it runs on: the seeded pattern
(``random.Random(seed + i).randbytes`` for the i-th connection, made and hashed
in :data:`CHUNK` pieces, so hundreds of MiB need no memory), the modes (``echo``,
``send``, ``pingpong``, ``drain``, ``abort``, ``hold``) and what each records.  Only how
sockets are made and how a connection is described (``smc_diag`` in the guest,
``smc_info()`` on the host) differ: :class:`Stack` says it.

This file runs in the guest's Python too (Debian 12: 3.11), so it needs nothing
beyond the standard library.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

CHUNK = 65536
ABORT_SCENARIOS = ("mid", "unread", "idle", "after")
ABORT_READ = 1 << 20  # what the aborter reads in ``mid`` before it aborts


@dataclass(frozen=True)
class Stack:
    """What differs between the two ends.

    :param name: ``kernel`` or ``smcr``: the end that aborts is ``--aborter``'s.
    :param key: the record's key for :attr:`describe`'s answer (``diag``, ``info``).
    :param describe: a connection's description, taken right after connect/accept.
    :param connect: a connected socket to ``(a.host, a.port)`` with ``a.timeout`` set.
    """

    name: str
    key: str
    describe: Callable[[Any], dict[str, Any] | None]
    connect: Callable[[argparse.Namespace], Any]


def smcr_description(sock: Any, stack_of: Callable[[str], Any]) -> dict[str, Any]:
    """How smcr's ends describe a connection: ``smc_info()``, and for SMC-R the link group as
    the engine holds it and the RNIC under it.  ``stack_of(local address)`` is smcr's runtime
    of the socket's address (passed in: this file imports nothing of smcr)."""
    i = sock.smc_info()
    out: dict[str, Any] = {"mode": i.mode, "local_code": i.local_code, "peer_code": i.peer_code}
    if i.mode != "SMCR":
        return out
    out |= {"version": i.version, "lgr_id": i.lgr_id, "first_contact": i.first_contact,
            "rmb_size": i.rmb_size, "peer_rmb_size": i.peer_rmb_size}  # fmt: skip
    stack = stack_of(sock.getsockname()[0])
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
    out["rnic"] = {"kind": type(stack.device).__name__, "name": stack.device.name}
    return out


def chunks(seed: int, n: int) -> Iterator[bytes]:
    """``n`` bytes of ``random.Random(seed).randbytes`` in pieces of :data:`CHUNK`, each a
    whole number of the generator's 32-bit words, so that any ``n`` bytes are the start
    of any longer run."""
    rng = random.Random(seed)
    while n > 0:
        k = min(CHUNK, n)
        yield rng.randbytes(k + (-k % 4))[:k]  # whole words: a prefix of any longer run
        n -= k


def drain(sock: Any) -> tuple[int, str]:
    """Read until EOF: how many bytes, and their SHA-256."""
    h, total = hashlib.sha256(), 0
    buf = bytearray(CHUNK)
    while n := sock.recv_into(buf):
        h.update(memoryview(buf)[:n])
        total += n
    return total, h.hexdigest()


def send_pattern(sock: Any, seed: int, n: int) -> str:
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


def read_outcome(sock: Any) -> tuple[str, int]:
    """Read until EOF or an error: how it ended, and the bytes read."""
    total = 0
    try:
        while piece := sock.recv(CHUNK):
            total += len(piece)
    except OSError as exc:
        return outcome(exc), total
    return "EOF", total


def so_error(sock: Any) -> str | None:
    """The error left pending on the socket (``SO_ERROR``), by name."""
    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    return errno.errorcode.get(err, str(err)) if err else None


def abort_one(sock: Any, a: argparse.Namespace, i: int, me: str) -> dict[str, Any]:
    """This end's part of abort scenario ``i``: ``mid`` (the aborter reads
    :data:`ABORT_READ` of what the other end keeps sending, then aborts once more has
    come in, unread), ``unread`` (the other end sends 64 bytes, the aborter aborts with
    them unread), ``idle`` (nothing sent); the end that does not abort records how its
    send and its read ended."""
    scenario = ABORT_SCENARIOS[i % len(ABORT_SCENARIOS)]
    out: dict[str, Any] = {"scenario": scenario}
    t0 = time.perf_counter()
    if a.aborter == me:  # this end aborts
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
    else:  # the other end aborts: how do our send and read end?
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
        out["so_error"] = so_error(sock)  # what is left pending
    out["seconds"] = time.perf_counter() - t0
    return out


def aborts(a: argparse.Namespace, i: int) -> bool:
    """Whether connection ``i`` is one of the abort scenarios (not the ``after`` echo)."""
    return a.mode == "abort" and ABORT_SCENARIOS[i % len(ABORT_SCENARIOS)] != "after"


def serve_one(conn: Any, a: argparse.Namespace, i: int, stack: Stack) -> dict[str, Any]:
    """The server's side of connection ``i``: ``echo`` until EOF, or ``send`` the pattern
    and close first (the close the server starts), or an abort scenario."""
    conn.settimeout(a.timeout)
    out: dict[str, Any] = {stack.key: stack.describe(conn)}
    t0 = time.perf_counter()
    if aborts(a, i):
        return out | abort_one(conn, a, i, stack.name)
    if a.mode == "send":
        sent_sha = send_pattern(conn, a.seed + i, a.bytes)
        conn.shutdown(socket.SHUT_WR)
        total, digest = drain(conn)
        return out | {"sent": a.bytes, "sent_sha256": sent_sha, "received": total,
                      "received_sha256": digest, "seconds": time.perf_counter() - t0}  # fmt: skip
    h, total = hashlib.sha256(), 0
    buf = bytearray(CHUNK)
    while n := conn.recv_into(buf):
        h.update(memoryview(buf)[:n])
        total += n
        conn.sendall(memoryview(buf)[:n])
    return out | {"received": total, "received_sha256": h.hexdigest(),
                  "seconds": time.perf_counter() - t0}  # fmt: skip


def serve(listener: Any, a: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    """Accept ``a.count`` clients one after another, each served to its end."""
    listener.settimeout(a.timeout)
    if a.mode == "hold":
        return hold_server(listener, a, stack)
    conns = []
    for i in range(a.count):
        conn, _peer = listener.accept()
        with conn:
            conns.append(serve_one(conn, a, i, stack))
    return {"conns": conns}


def hold_server(listener: Any, a: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    """``hold``: accept ``a.count`` clients, all kept open; read each to EOF (the client
    sends ``a.bytes`` and closes); then ``a.pause`` seconds later (the client's process
    has ended by then) close them one by one, each close timed (a slow server that
    closes after its peer went away)."""
    conns: list[tuple[Any, dict[str, Any]]] = []
    for _ in range(a.count):
        conn, _peer = listener.accept()
        conn.settimeout(a.timeout)
        conns.append((conn, {stack.key: stack.describe(conn)}))
    for conn, rec in conns:
        rec["read"], rec["received"] = read_outcome(conn)
    time.sleep(a.pause)
    for conn, rec in conns:
        t0 = time.perf_counter()
        try:
            conn.close()
            rec["close"] = "ok"
        except OSError as exc:
            rec["close"] = outcome(exc)
        rec["close_seconds"] = time.perf_counter() - t0
    return {"conns": [rec for _conn, rec in conns]}


def hold_client(a: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    """``hold``: ``a.count`` connections opened one after another and all kept open, then
    ``a.bytes`` sent on each, then each closed; the process ends right after (what the
    server does then is the test's point)."""
    socks: list[Any] = []
    recs: list[dict[str, Any]] = []
    for _ in range(a.count):
        s = stack.connect(a)
        socks.append(s)
        recs.append({stack.key: stack.describe(s)})
    for s in socks:
        s.sendall(bytes(a.bytes))
    t0 = time.perf_counter()
    for s in socks:
        s.close()
    return {"conns": recs, "close_seconds": time.perf_counter() - t0}


def pingpong(s: Any, a: argparse.Namespace) -> dict[str, Any]:
    """``a.iters`` round trips of ``a.size`` bytes (``a.pause`` of silence between them),
    timed; then shut down writing and read to EOF."""
    t0 = time.perf_counter()
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
    out: dict[str, Any] = {"iters": a.iters, "size": a.size, "echoed_intact": ok,
                           "pingpong_seconds": time.perf_counter() - t0}  # fmt: skip
    s.shutdown(socket.SHUT_WR)
    out["received"], out["received_sha256"] = drain(s)
    return out


def echo(s: Any, a: argparse.Namespace, i: int) -> dict[str, Any]:
    """Send ``a.bytes`` of the pattern (in a thread, then shut down writing) while reading
    the echo back to EOF."""
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
    out: dict[str, Any] = {}
    out["received"], out["received_sha256"] = drain(s)
    sender.join(a.timeout)
    return out | {"sent": a.bytes, "sent_sha256": sent[0] if sent else None,
                  "send_error": repr(failed[0]) if failed else None}  # fmt: skip


def client_one(a: argparse.Namespace, i: int, stack: Stack) -> dict[str, Any]:
    """Connection ``i`` of the client: its mode's exchange, and the record of it."""
    t0 = time.perf_counter()
    with stack.connect(a) as s:
        out: dict[str, Any] = {"connect_seconds": time.perf_counter() - t0,
                               stack.key: stack.describe(s)}  # fmt: skip
        t0, cpu0, busy0 = time.perf_counter(), os.times(), system_busy()
        if aborts(a, i):
            return out | abort_one(s, a, i, stack.name)
        if a.mode == "abort":  # after the aborts: a short echo
            a = argparse.Namespace(**(vars(a) | {"mode": "echo", "bytes": CHUNK}))
        if a.mode == "send":
            out["received"], out["received_sha256"] = drain(s)
        elif a.mode == "drain":  # what the server sends, until EOF or an error (recorded)
            out["read"], out["received"] = read_outcome(s)
            out["so_error"] = so_error(s)
        elif a.mode == "pingpong":
            out |= pingpong(s, a)
        else:
            out |= echo(s, a, i)
        out["seconds"] = time.perf_counter() - t0
        cpu1 = os.times()  # the process's, every thread (the runtime's too)
        out["cpu_seconds"] = cpu1.user + cpu1.system - cpu0.user - cpu0.system
        out["system_busy_seconds"] = system_busy() - busy0
    return out


def system_busy() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``: all but idle and iowait),
    which counts what a kernel RNIC does for the process in softirq context too."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def client(a: argparse.Namespace, stack: Stack) -> dict[str, Any]:
    """``a.count`` connections one after another (``hold``: all open at once)."""
    if a.mode == "hold":
        return hold_client(a, stack)
    return {"conns": [client_one(a, i, stack) for i in range(a.count)]}


def add_exchange_args(p: argparse.ArgumentParser, host: str, modes: list[str]) -> None:
    """The options both ends take (the peer's address defaults to ``host``)."""
    p.add_argument("--host", default=host)
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--count", type=int, default=1)
    p.add_argument("--mode", choices=modes, default="echo")
    p.add_argument("--aborter", choices=["kernel", "smcr"], default="smcr")
    p.add_argument("--bytes", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--size", type=int, default=1)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)
