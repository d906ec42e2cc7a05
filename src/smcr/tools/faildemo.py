"""``smcr demo --failover`` (root): redundant links shown to a person.

Two network namespaces joined by two veth pairs, ``p0`` and ``p1`` (a RoCE RNIC on each:
``SMCR_RNIC=roce``, ``SMCR_ROCE_DEVS=p0,p1``).  A client process in one streams random
bytes to a server process in the other over one SMC-R connection.  The demo prints, a
few times a second, the link group as each side sees it (type, links, the net device of
each, which link carries the connection) and the bytes on each veth; a fifth of the
way in it sets ``p0`` down, a second later up again; at the end both sides' SHA-256
of the stream are compared.  The namespaces are removed at the end.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import subprocess
import time
from multiprocessing.connection import Connection
from typing import Any

from rich.console import Console

VOLUME = 1 << 30
CHUNK = 64 << 10
REPORT = 0.25


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _links() -> dict[str, Any]:
    """The process's (only) link group: type, and per link id, net device, state, conns."""
    from smcr.stack.runtime import process_stacks  # noqa: PLC0415

    for stack in process_stacks():
        with stack.lock:
            for lgr in stack.engine.lgrs.values():
                if lgr.terminated:
                    continue
                links = []
                for x in sorted(lgr.links, key=lambda k: k.link_id):
                    conns = sum(1 for c in lgr.conns.values() if c.link is x)
                    links.append((x.link_id, stack.ports[x.port].device.netdev, x.state.value,
                                  conns))  # fmt: skip
                return {"type": lgr.lgr_type.value, "links": links}
    return {"type": "-", "links": []}


def _report(ctl: Connection, moved: list[int], stop: list[bool]) -> None:
    while not stop[0]:
        ctl.send(("status", moved[0], _links()))
        time.sleep(REPORT)


def _peer(ctl: Connection, ns: str, role: str, address: str, port: int) -> None:
    """A demo end inside namespace ``ns``: the server sinks and hashes, the client streams."""
    import threading  # noqa: PLC0415

    from smcr.tools.netns import enter_netns  # noqa: PLC0415

    enter_netns(ns)
    import smcr  # noqa: PLC0415

    moved, stop = [0], [False]
    h = hashlib.sha256()
    if role == "server":
        srv = smcr.create_server((address, 0))
        ctl.send(("port", srv.getsockname()[1]))
        conn, _ = srv.accept()
        threading.Thread(target=_report, args=(ctl, moved, stop), daemon=True).start()
        buf = bytearray(CHUNK)
        while n := conn.recv_into(buf):
            h.update(buf[:n])
            moved[0] += n
        conn.close()
        srv.close()
    else:
        conn = smcr.create_connection((address, port), timeout=30)
        threading.Thread(target=_report, args=(ctl, moved, stop), daemon=True).start()
        for _ in range(VOLUME // CHUNK):
            block = os.urandom(CHUNK)
            conn.sendall(block)
            h.update(block)
            moved[0] += len(block)
        conn.close()
    stop[0] = True
    time.sleep(REPORT)
    # the group is shown once the link added again has settled (an asymmetric link made
    # during the cut is replaced by the symmetric one when p0 is back: that may still run)
    settle = time.monotonic() + 15
    while role == "server" and _links().get("type") != "SYMMETRIC" and time.monotonic() < settle:
        time.sleep(0.1)
    ctl.send(("done", h.hexdigest(), _links()))
    ctl.recv()  # until the demo has shown the end


def _veth_bytes(ns: str, dev: str) -> int:
    out = subprocess.run(["ip", "-n", ns, "-s", "-j", "link", "show", dev], check=False,
                         capture_output=True, text=True, timeout=10).stdout  # fmt: skip
    import json  # noqa: PLC0415

    try:
        stats = json.loads(out)[0]["stats64"]
        return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])
    except (ValueError, KeyError, IndexError):
        return 0


def run(console: Console) -> int:
    """Run the demo; 0 when both digests match and the group is back to two links."""
    if os.geteuid() != 0:
        console.print("[red]smcr demo --failover needs root (network namespaces)[/red]")
        return 1
    tag = f"smcr-fo{os.getpid() % 100000}"
    ns = (f"{tag}a", f"{tag}b")
    nets = ("10.141.1", "10.142.1")
    procs: list[Any] = []
    try:
        for n in ns:
            _ip("netns", "add", n)
            _ip("-n", n, "link", "set", "lo", "up")
        for i, net in enumerate(nets):
            _ip("link", "add", f"{tag}p{i}a", "netns", ns[0], "type", "veth", "peer", "name",
                f"{tag}p{i}b", "netns", ns[1])  # fmt: skip
            for side, n in enumerate(ns):
                _ip("-n", n, "link", "set", f"{tag}p{i}{'ab'[side]}", "name", f"p{i}")
                _ip("-n", n, "addr", "add", f"{net}.{side + 1}/24", "dev", f"p{i}")
                _ip("-n", n, "link", "set", f"p{i}", "up")
        console.print(f"[bold]smcr demo --failover[/bold]: namespaces {ns[0]} (server) and "
                      f"{ns[1]} (client), joined by veth pairs p0 ({nets[0]}.0/24) and p1 "
                      f"({nets[1]}.0/24); a RoCE RNIC on each")  # fmt: skip
        os.environ.update(SMCR_RNIC="roce", SMCR_ROCE_DEVS="p0,p1")
        ctx = mp.get_context("spawn")
        ends: list[tuple[str, Connection, int]] = []
        for side, role in enumerate(("server", "client")):
            ctl, child = ctx.Pipe()
            port = 0 if role == "server" else ends[0][2]
            proc = ctx.Process(target=_peer, args=(child, ns[side], role, f"{nets[0]}.1", port),
                               daemon=True)  # fmt: skip
            proc.start()
            procs.append(proc)
            got = ctl.recv() if role == "server" and ctl.poll(30) else ("port", 0)
            ends.append((role, ctl, got[1]))
        console.print("each line: bytes received by the server | its link group: type, links "
                      "as id:net device (* carries the connection) | bytes through each veth")
        return _watch(console, ns, ends)
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], check=False, capture_output=True)


def _watch(console: Console, ns: tuple[str, str], ends: list[Any]) -> int:
    status: dict[str, Any] = {}
    done: dict[str, Any] = {}
    cut_at = up_at = None
    last = 0.0
    deadline = time.monotonic() + 600
    while len(done) < 2 and time.monotonic() < deadline:
        for role, ctl, _ in ends:
            while ctl.poll(0.01):
                msg = ctl.recv()
                if msg[0] == "status":
                    status[role] = msg
                elif msg[0] == "done":
                    done[role] = msg
        moved = status.get("server", ("", 0))[1]
        now = time.monotonic()
        if cut_at is None and moved >= VOLUME // 5:
            _ip("-n", ns[0], "link", "set", "p0", "down")
            cut_at = now
            console.print("[bold red]>>> p0 set down[/bold red]")
        if cut_at is not None and up_at is None and now - cut_at >= 1.0:
            _ip("-n", ns[0], "link", "set", "p0", "up")
            up_at = now
            console.print("[bold green]>>> p0 set up again[/bold green]")
        if now - last >= 0.5 and "server" in status:
            last = now
            lgr = status["server"][2]
            links = " ".join(f"{lid}:{dev}{'*' if conns else ''}"
                             f"{'' if state == 'LINK_ACTIVE' else '(' + state[5:].lower() + ')'}"
                             for lid, dev, state, conns in lgr["links"])  # fmt: skip
            traffic = " ".join(f"p{i} {_veth_bytes(ns[0], f'p{i}') >> 20:4d}" for i in (0, 1))
            console.print(f"{moved >> 20:4d} MiB in | {lgr['type']:<16} {links:<22} | veth MiB "
                          f"{traffic}")  # fmt: skip
    for _, ctl, _ in ends:
        ctl.send("bye")
    if len(done) < 2:
        console.print("[red]the transfer did not end in time[/red]")
        return 1
    same = done["server"][1] == done["client"][1]
    final = done["server"][2]
    console.print(f"SHA-256 sent {done['client'][1][:16]}... received {done['server'][1][:16]}"
                  f"... match: [bold]{same}[/bold]; the server's group at the end: "
                  f"{final['type']} with {len(final['links'])} links")  # fmt: skip
    return 0 if same and len(final["links"]) == 2 else 1

