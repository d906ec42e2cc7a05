"""smcr's end of the peer-gone tests: the kernel peer's process killed, its interface down.

``python -m tests.interop.peer_gone kill|linkdown`` runs one scenario in netns
``smcnet`` (joined by ``setns``, as ``smc_host``) and drives the guest itself
(its 9p agent is a directory: :class:`tests.interop.guest.Guest`), so that one
smcr process sees the whole story, link groups included:

``kill``
    The guest's AF_SMC server sends without end; smcr reads 4 MiB, then the
    server process is killed (``kill -9``).  How smcr's read ends and how long
    after the kill; then a 1 MiB echo with a new server process, on the same
    link group (the kernel closed the socket of the dead process as ``close``).
``linkdown``
    ``mid``: as ``kill``, but the guest's eth0 (rxe0's netdev) goes down instead;
    ``idle``: a connection after one round trip, smcr blocked in ``recv``, then
    eth0 down.  Each time eth0 comes back up after smcr has given its error;
    then a 1 MiB echo on a new link group.  smcr's TEST LINK finds the dead link
    (``SMCR_TESTLINK_TIME``, 1 s here): rxe, like Linux, retries an RC send
    without end (retry count 7), so no completion error would ever come.

Prints one JSON line: per step, smcr's ``smc_info`` (link group id, first
contact), how its read ended (``EOF``, ``ECONNRESET``...), the bytes and the
seconds from the event to the error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Any

import smcr
from smcr.socket import SMCSocket
from smcr.tools.netns import enter_netns
from tests.interop.guest import GUEST_IP, NETNS, Guest, cache_dir
from tests.interop.harness.tools.exchange_end import client_one, read_outcome
from tests.interop.kernel_exchange import GUEST_UEID, ueid_file
from tests.interop.smc_host import info, smcr_stack

TOOL = "python3 /mnt/host/tools/kernel_smc.py"
MB = 1 << 20
FIRST_PORT = 20900
TIMEOUT = 30.0
"""Bound of every socket call: an error must come well within it."""


def start_server(guest: Guest, port: int, mode: str, nbytes: int) -> tuple[str, int]:
    """The guest's AF_SMC server on ``port`` (one connection); its command id and pid."""
    ident = guest.run(f"{TOOL} server --family smc --port {port} --mode {mode}"
                      f" --bytes {nbytes} --timeout {TIMEOUT}", background=True)  # fmt: skip
    out = guest.wait_listening(ident)
    return ident, json.loads(out.splitlines()[0])["pid"]


def end_of(guest: Guest, ident: str) -> str:
    """How the guest command ended: its last line, or the error of a failed one."""
    try:
        return guest.wait(ident, 60).strip().splitlines()[-1]
    except RuntimeError as exc:  # killed (its status), or its socket failed (the error)
        lines = str(exc).strip().splitlines()
        return lines[0] if len(lines) == 1 else lines[-1]


def read_some(sock: SMCSocket, n: int) -> int:
    got = 0
    while got < n and (piece := sock.recv(65536)):
        got += len(piece)
    return got


def link(guest: Guest, up: bool) -> None:
    """The guest's eth0 up or down; up: until rxe0's port is ACTIVE again."""
    guest.run(f"ip link set eth0 {'up' if up else 'down'}", timeout=30)
    if up:
        deadline = time.monotonic() + 30
        while "state ACTIVE" not in guest.run("rdma link show rxe0/1", timeout=30):
            if time.monotonic() > deadline:
                raise AssertionError("rxe0 did not come back")
            time.sleep(0.2)


def echo(port: int, guest: Guest) -> dict[str, Any]:
    """A 1 MiB echo with a new guest server: smcr's record (``exchange_end.client_one``)."""
    ident, _pid = start_server(guest, port, "echo", MB)
    a = argparse.Namespace(host=GUEST_IP, port=port, timeout=TIMEOUT, mode="echo", seed=port,
                           bytes=MB, iters=0, size=0, pause=0.0)  # fmt: skip
    out = client_one(a, 0, smcr_stack())
    out["guest_end"] = end_of(guest, ident)
    return out


def gone(sock: SMCSocket, event: Any) -> dict[str, Any]:
    """Do ``event()``, then read until smcr's read ends; how and after how long."""
    t0 = time.monotonic()
    event()
    end, n = read_outcome(sock)
    return {"read": end, "received_after": n, "seconds": time.monotonic() - t0}


def kill(guest: Guest) -> dict[str, Any]:
    port = FIRST_PORT
    ident, pid = start_server(guest, port, "send", 1 << 40)
    with smcr.create_connection((GUEST_IP, port), timeout=TIMEOUT) as s:
        step: dict[str, Any] = {"info": info(s), "received": read_some(s, 4 * MB)}
        step |= gone(s, lambda: guest.run(f"kill -9 {pid}", timeout=30))
    step["guest_end"] = end_of(guest, ident)
    return {"killed": step, "after": echo(port + 1, guest)}


def linkdown(guest: Guest) -> dict[str, Any]:
    port = FIRST_PORT + 10
    out: dict[str, Any] = {}
    ident, _pid = start_server(guest, port, "send", 1 << 40)
    try:
        with smcr.create_connection((GUEST_IP, port), timeout=TIMEOUT) as s:
            step: dict[str, Any] = {"info": info(s), "received": read_some(s, 4 * MB)}
            out["mid"] = step | gone(s, lambda: link(guest, False))
    finally:
        link(guest, True)
    out["mid"]["guest_end"] = end_of(guest, ident)
    ident, _pid = start_server(guest, port + 1, "echo", 1024)
    try:
        with smcr.create_connection((GUEST_IP, port + 1), timeout=TIMEOUT) as s:
            step = {"info": info(s)}
            s.sendall(b"x" * 1024)
            step["received"] = read_some(s, 1024)
            out["idle"] = step | gone(s, lambda: link(guest, False))
    finally:
        link(guest, True)
    out["idle"]["guest_end"] = end_of(guest, ident)
    out["after"] = echo(port + 2, guest)
    return out


def main() -> None:
    scenario = sys.argv[1]
    table = ueid_file([GUEST_UEID])
    # before the runtime starts: as kernel_exchange's smc_host, and the keepalive at 1 s
    os.environ.update({"SMCR_RNIC": "roce", "SMCR_DISCOVERY": "bpf",
                       "SMCR_UEID_FILE": str(table)})  # fmt: skip
    os.environ.setdefault("SMCR_TESTLINK_TIME", "1")
    enter_netns(NETNS)
    guest = Guest(cache_dir())
    try:
        result = {"kill": kill, "linkdown": linkdown}[scenario](guest)
    finally:
        shutil.rmtree(table.parent, ignore_errors=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
