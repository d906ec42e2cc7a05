"""``smcr demo``: an SMC-R connection between two processes of this host, end to end.

A server process (spawned) listens with :func:`smcr.create_server`; this
process connects with :func:`smcr.create_connection`.  The demo prints how the
connection is made (mode, link group, link, buffers: what ``smcss`` and
``smcr linkgroup show`` would say), sends a volume of data checked with
SHA-256, and times the same transfer over plain TCP on loopback, side by side,
in two write sizes: 64 KiB (where smcr's per-write Python cost still shows) and
1 MiB (a bulk writer: where the copy, not the code, sets the pace).
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import socket
import time
from multiprocessing.connection import Connection
from typing import Any

from rich.console import Console
from rich.table import Table

VOLUME = 256 << 20
"""Bytes per transfer: large enough that one transfer takes tens of milliseconds."""
SIZES = (64 << 10, 1 << 20)
"""The write sizes, each timed over SMC-R and over TCP."""
BUFSIZE = 4 << 20
"""SO_SNDBUF/SO_RCVBUF for the SMC-R sockets: 4 MiB buffers, as a bulk application
would set them (smcr's default; see ``smcr bench --bufsize``)."""


def _serve(ctl: Connection, volume: int, rounds: int) -> None:
    """The server process: one SMC listener, one plain TCP listener, ``rounds`` connections
    on each in turn (SMC first); each time take ``volume`` bytes into memory, say so
    (one byte), then send their SHA-256.

    The digest is computed after the receipt: hashing at the pace of the transfer
    would make both transports run at SHA-256's speed and hide what is measured."""
    import smcr  # noqa: PLC0415

    smc = smcr.create_server(("127.0.0.1", 0))
    smc.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFSIZE)
    smc.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFSIZE)
    tcp = socket.create_server(("127.0.0.1", 0))
    sink = bytearray(b"\xff") * volume  # written once now: no page faults while timed
    view = memoryview(sink)
    ctl.send((smc.getsockname()[1], tcp.getsockname()[1]))
    for _ in range(rounds):
        for listener in (smc, tcp):
            conn, _ = listener.accept()
            info = conn.smc_info() if isinstance(conn, smcr.SMCSocket) else None
            got = 0
            while got < volume and (n := conn.recv_into(view[got:])):
                got += n
            conn.sendall(b"k")
            conn.sendall(hashlib.sha256(view[:got]).digest())
            ctl.send((info, _link_groups(), os.getpid()))
            conn.close()
    smc.close()
    tcp.close()


def _link_groups() -> list[tuple[int, str, str, int]]:
    """(id, role, type, connections) of every link group of this process's runtimes.

    All of them, not those of :func:`get_stack`'s default RNIC: with ``SMCR_RNIC=roce``
    the connection lives on the RNIC of its local address.
    """
    from smcr.stack.runtime import process_stacks  # noqa: PLC0415

    lgrs = []
    for stack in process_stacks():
        with stack.lock:
            lgrs += [(lgr.lgr_id, lgr.role.value, lgr.lgr_type.value, len(lgr.conns))
                     for lgr in stack.engine.lgrs.values()]  # fmt: skip
    return lgrs


def rnic_label(kind: str) -> str:
    """What the RNIC kind is, in the demo's words."""
    if kind == "roce":
        return "RoCE: user-space RoCEv2, UDP 4791"
    return "shm: shared memory between processes"


def _transfer(sock: Any, size: int) -> tuple[float, bytes, bytes]:
    """Send VOLUME bytes in ``size``-byte writes, timed until the peer says it has them
    all; then read its digest.  ``(seconds, ours, theirs)``; our digest is computed
    before the clock starts."""
    block = os.urandom(size)
    h = hashlib.sha256()
    for _ in range(VOLUME // size):
        h.update(block)
    t0 = time.perf_counter()
    for _ in range(VOLUME // size):
        sock.sendall(block)
    receipt = sock.recv(1)
    elapsed = time.perf_counter() - t0
    digest = b""
    while receipt and len(digest) < 32 and (part := sock.recv(32 - len(digest))):
        digest += part
    return elapsed, h.digest(), digest


def _smc_socket(port: int) -> Any:
    import smcr  # noqa: PLC0415

    sock = smcr.SMCSocket()
    sock.settimeout(30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFSIZE)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFSIZE)
    sock.connect(("127.0.0.1", port))
    return sock


def _discovery(console: Console) -> None:
    """Make sure the two ends will know of each other (:mod:`smcr.discovery`), and say how.

    The TCP option if it is on; else, as root, turn it on (``smcr enable``, what
    install.sh does); else list loopback as an SMC peer for the demo's processes.
    """
    from smcr import discovery  # noqa: PLC0415
    from smcr.discovery import bpf  # noqa: PLC0415

    found = discovery.current()
    if found.mode == "off" and os.geteuid() == 0:
        try:
            state = bpf.enable()
            console.print(f"discovery: turned the SMC TCP option on for cgroup {state.cgroup} "
                          "(as `smcr enable`; `smcr disable` turns it off)")
        except OSError as exc:
            console.print(f"discovery: could not turn the TCP option on: {exc}")
        discovery.reset()
        found = discovery.current()
    if found.mode == "off":
        os.environ["SMCR_PEERS"] = "127.0.0.1"
        discovery.reset()
        found = discovery.current()
        console.print("discovery: the TCP option is off (needs root: `smcr enable`); this demo "
                      "lists 127.0.0.1 as an SMC peer instead (SMCR_PEERS=127.0.0.1)")
    else:
        console.print(f"discovery: {found.mode} ({found.why})")


def run(console: Console) -> int:
    """Run the demo; exit status 0 when SMC-R was used and both digests matched."""
    from smcr.stack import devices  # noqa: PLC0415
    from smcr.stack.runtime import process_stacks  # noqa: PLC0415

    kind = devices.rnic_kind()
    _discovery(console)
    ctx = mp.get_context("spawn")
    ctl, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child, VOLUME, len(SIZES)), daemon=True)
    console.print(f"[bold]smcr demo[/bold]: SMC-R between two processes over the {kind} RNIC")
    proc.start()
    results: list[tuple[int, float, bool, float, bool]] = []
    try:
        if not ctl.poll(30):
            console.print("[red]server process did not start[/red]")
            return 1
        smc_port, tcp_port = ctl.recv()
        for size in SIZES:
            t0 = time.perf_counter()
            sock = _smc_socket(smc_port)
            setup = time.perf_counter() - t0
            if not results:
                info = sock.smc_info()
                _show_connection(console, sock, info, process_stacks(), setup, kind)
            smc_time, ours, theirs = _transfer(sock, size)
            server_info, server_lgrs, server_pid = ctl.recv()
            sock.close()
            tcp_sock = socket.create_connection(("127.0.0.1", tcp_port), timeout=30)
            tcp_time, tcp_ours, tcp_theirs = _transfer(tcp_sock, size)
            ctl.recv()
            tcp_sock.close()
            results.append((size, smc_time, ours == theirs, tcp_time, tcp_ours == tcp_theirs))
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    console.print(f"server process {server_pid}: accepted in mode "
                  f"[bold]{server_info.mode}[/bold], link groups {server_lgrs}")  # fmt: skip
    table = Table(title=f"{VOLUME >> 20} MiB each, timed until the receiver has it all, "
                  "SHA-256 checked")
    for col in ("writes", "transport", "seconds", "MB/s", "SHA-256 match"):
        table.add_column(col)
    ratios = []
    for size, smc_time, smc_ok, tcp_time, tcp_ok in results:
        smc_rate, tcp_rate = VOLUME / smc_time / 1e6, VOLUME / tcp_time / 1e6
        label = f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        table.add_row(label, f"SMC-R ({kind} RNIC)", f"{smc_time:.3f}", f"{smc_rate:.0f}",
                      str(smc_ok))  # fmt: skip
        table.add_row(label, "TCP loopback", f"{tcp_time:.3f}", f"{tcp_rate:.0f}", str(tcp_ok))
        ratios.append(f"[bold]{smc_rate / tcp_rate:.2f}x[/bold] in {label} writes")
    console.print(table)
    console.print("SMC-R / TCP throughput: " + ", ".join(ratios))
    ok = info.mode == "SMCR" and all(r[2] and r[4] for r in results)
    return 0 if ok else 1


def _show_connection(console: Console, sock: Any, info: Any, stacks: list[Any], setup: float,
                     kind: str) -> None:  # fmt: skip
    if info.mode != "SMCR":
        console.print(f"[red]fell back to TCP[/red], reason {info.reason}")
        return
    table = Table(title="the connection (client side)")
    table.add_column("what")
    table.add_column("value")
    table.add_row("mode", "SMCR")
    table.add_row("TCP", f"{sock.getsockname()} -> {sock.getpeername()}")
    table.add_row("set-up", f"{setup * 1000:.1f} ms (first contact: {info.first_contact})")
    table.add_row("state", info.state)
    table.add_row("RMB / peer RMB", f"{info.rmb_size} / {info.peer_rmb_size} bytes")
    for stack in stacks:
        with stack.lock:
            lgr = stack.engine.lgrs.get(info.lgr_id)
            if lgr is None:
                continue
            table.add_row("link group", f"id {lgr.lgr_id}, role {lgr.role.value}, "
                          f"type {lgr.lgr_type.value}, {len(lgr.conns)} connection(s)")  # fmt: skip
            for link in lgr.links:
                table.add_row(f"link {link.link_id}", f"{link.state.value}, QP {link.qpn:#x} -> "
                              f"peer QP {link.peer_qpn:#x}, MTU enum {link.mtu}")  # fmt: skip
                table.add_row("  local GID", stack.device.gid.hex())
                table.add_row("  peer GID", link.peer_gid.hex())
            table.add_row("RNIC", f"{stack.device.name} ({rnic_label(kind)})")
    console.print(table)
