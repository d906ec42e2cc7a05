"""What a process tells the tools: its sockets, link groups, links, RNICs and counters.

Runs in the diag thread (:mod:`smcr.diag.server`).  The runtime's tables are
read under :attr:`Stack.lock <smcr.stack.runtime.Stack.lock>`, taken with a
timeout (:data:`LOCK_WAIT`): a runtime busy that long is reported as
``partial`` instead of holding the answer (and the tool) up.  Values are copied
out under the lock and formatted after it.  Names and shapes are those of the
README's "Observability" section (the tools' ``--json``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import time
from typing import Any

from smcr.diag import registry
from smcr.stack.counters import COUNTERS

LOCK_WAIT = 0.5
SMCSS_STATE = {"APPFINCLOSEWAIT": "APPFINCLOSEWAIT1"}
"""Engine state names that smcss prints otherwise (the rest print as they are named)."""
_START = time.time()


def state_name(state: Any) -> str:
    """The smcss word for an engine :class:`~smcr.core.close.SmcState`."""
    name = str(getattr(state, "name", state))
    return SMCSS_STATE.get(name, name)


def _cursor(absolute: int, size: int) -> str:
    """smcss's ``wrap:count`` (``%04x:%08x``) of an absolute position in a ring."""
    if size <= 0:
        return "0000:00000000"
    wrap, count = divmod(absolute, size)
    return f"{wrap & 0xFFFF:04x}:{count:08x}"


def _gid(raw: bytes) -> str:
    addr = ipaddress.IPv6Address(bytes(raw)) if len(raw) == 16 else None
    if addr is None:
        return raw.hex()
    return f"::ffff:{addr.ipv4_mapped}" if addr.ipv4_mapped is not None else str(addr)


def _address(sock: socket.socket, peer: bool) -> str:
    """``host:port`` (``[v6]:port``) or ``-`` when there is none (closed, not connected)."""
    try:
        addr = sock.getpeername() if peer else sock.getsockname()
    except OSError:
        return "-"
    if not isinstance(addr, tuple):
        return "-"
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _inode(sock: socket.socket) -> int:
    with contextlib.suppress(OSError, ValueError):
        fd = socket.socket.fileno(sock)
        if fd >= 0:
            return os.fstat(fd).st_ino
    return 0


def netns_inode() -> int:
    """The inode of this process's network namespace (``/proc/self/ns/net``), 0 unknown."""
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return 0


def process_info() -> dict[str, Any]:
    """pid, uid, command, network namespace, start time."""
    comm = ""
    with contextlib.suppress(OSError), open("/proc/self/comm") as f:
        comm = f.read().strip()  # closed here: an unclosed file warns (ResourceWarning)
    return {"pid": os.getpid(), "uid": os.getuid(), "comm": comm,
            "cmdline": " ".join(sys.argv)[:200], "netns": netns_inode(),
            "start_time": _START}  # fmt: skip


def _stacks() -> list[Any]:
    """This process's runtimes (not those a forked child inherited from its parent)."""
    runtime = sys.modules.get("smcr.stack.runtime")
    if runtime is None:
        return []
    stacks: list[Any] = runtime.process_stacks()
    return stacks


def _smc_row(stack: Any, hc: Any, c: Any, uid: int) -> dict[str, Any] | None:
    """One runtime connection as an ``ss`` row (lock held); None when it is not SMC-R."""
    hs = hc.handshake
    if hc.outcome is not None and type(hc.outcome).__name__ != "HandshakeCompleted":
        return None  # fell back or failed: the socket layer's (registry.fallbacks)
    tcp = hc.tcp
    row: dict[str, Any] = {
        "state": "INIT" if c is None else state_name(c.state), "mode": "SMCR",
        "local_code": 0, "peer_code": 0, "uid": uid, "inode": _inode(tcp),
        "local": _address(tcp, False), "peer": _address(tcp, True),
        "role": "CLNT" if getattr(hs, "client", False) else "SERV",
    }  # fmt: skip
    lgr_id, link_id, peer_gid = getattr(hc.outcome, "lgr_id", 0), 0, ""
    link = stack.engine.links.get(c.qpn) if c is not None else None
    dev = stack.device
    if link is not None:
        lgr_id, link_id, peer_gid = link.lgr.lgr_id, link.link_id, _gid(link.peer_gid)
        dev = _link_device(stack, link)
    row.update(device=dev.name, netdev=dev.netdev or "-", gid=_gid(dev.gid), lgr_id=lgr_id,
               link_id=link_id, peer_gid=peer_gid)  # fmt: skip
    if c is None:
        return row
    rmb, snd = c.rmb.size, c.sndbuf_size
    shut_rd = c.peer_done
    shut_wr = bool(c.tx_flags)
    row.update(
        shutdown=("<" if shut_rd else "-") + "-" + (">" if shut_wr else "-"),
        token=c.token, sndbuf=snd, rcvbuf=rmb, peerbuf=c.peer_rmb_size,
        rx_prod=_cursor(c.rx_prod, rmb), rx_cons=_cursor(c.rx_cons, rmb),
        rx_flags=c.rx_flags, tx_prod=_cursor(c.tx_sent, c.peer_rmb_size),
        tx_cons=_cursor(c.peer_cons, c.peer_rmb_size), tx_flags=c.tx_flags,
        tx_prep=_cursor(c.tx_app, snd), tx_sent=_cursor(c.tx_sent, snd),
        tx_fin=_cursor(c.tx_fin, snd), tx_bytes=c.tx_app, rx_bytes=c.rx_cons,
    )  # fmt: skip
    return row


def _socket_row(sock: Any, uid: int, listening: bool) -> dict[str, Any] | None:
    """A listening or fallback socket as an ``ss`` row; None once it is closed."""
    if getattr(sock, "_closed", True) or getattr(sock, "_gone", False):
        return None
    if _inode(sock) == 0:
        return None
    info = getattr(sock, "_info", None)
    if listening:
        mode, state, local, peer = ("SMCR" if getattr(sock, "_smc_ok", False) else "TCP",
                                    "LISTEN", 0, 0)  # fmt: skip
    else:
        mode, state = "TCP", "ACTIVE"
        local, peer = getattr(info, "local_code", 0), getattr(info, "peer_code", 0)
    return {"state": state, "mode": mode, "local_code": local, "peer_code": peer, "uid": uid,
            "inode": _inode(sock), "local": _address(sock, False),
            "peer": _address(sock, True)}  # fmt: skip


def gather(partial: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                        list[dict[str, Any]], dict[str, int]]:  # fmt: skip
    """Sockets, link groups, RNICs and the live connections' byte counts of every runtime.

    :param partial: gets a line for each runtime whose lock could not be had.
    """
    uid = os.getuid()
    rows: list[dict[str, Any]] = []
    lgrs: list[dict[str, Any]] = []
    devices: list[dict[str, Any]] = []
    live = {"tx": 0, "rx": 0, "peer_full": 0}
    for stack in _stacks():
        if not stack.lock.acquire(timeout=LOCK_WAIT):
            partial.append(f"runtime {stack.device.name} busy")
            continue
        try:
            engine = stack.engine
            _add_live(stack, live)
            for hc in list(stack.conns.values()):
                row = _smc_row(stack, hc, stack.engine_conn(hc), uid)
                if row is not None:
                    rows.append(row)
            found = [_lgr_row(stack, lgr) for lgr in list(engine.lgrs.values())]
        finally:
            stack.lock.release()
        lgrs += found
        nlinks = sum(len(g["links"]) for g in found)
        devices.append({"name": stack.device.name, "type": type(stack.device).__name__,
                        "netdev": stack.device.netdev or "-", "gid": _gid(stack.device.gid),
                        "state": str(getattr(stack.device.port_state, "name", "ACTIVE")),
                        "links": nlinks,
                        "crit": any(len(g["links"]) < 2 for g in found)})  # fmt: skip
    for sock in registry.members(registry.listening):
        if (row := _socket_row(sock, uid, True)) is not None:
            rows.append(row)
    for sock in registry.members(registry.fallbacks):
        if (row := _socket_row(sock, uid, False)) is not None:
            rows.append(row)
    return rows, lgrs, devices, live


def _add_live(stack: Any, live: dict[str, int]) -> None:
    """Add the runtime's connections' byte counts (lock held): the released ones are in
    :attr:`Counters.closed_tx_bytes <smcr.stack.counters.Counters.closed_tx_bytes>`."""
    for c in stack.engine_conns():
        live["tx"] += c.tx_app
        live["rx"] += c.rx_cons
        live["peer_full"] += getattr(c, "stats_write_blocked", 0)


def _link_device(stack: Any, link: Any) -> Any:
    """The RNIC of a link's port (a runtime over several RNICs: each link's own)."""
    ports = getattr(stack, "ports", None)
    return ports[link.port].device if ports and link.port < len(ports) else stack.device


def _lgr_row(stack: Any, lgr: Any) -> dict[str, Any]:
    """A link group and its links (lock held), with smc-tools' words."""
    dev = stack.device
    links = []
    for link in list(lgr.links):
        ldev = _link_device(stack, link)
        conns = sum(1 for c in lgr.conns.values() if getattr(c, "link", link) is link)
        links.append({"link_id": link.link_id, "state": str(link.state.value),
                      "conns": conns, "qpn": link.qpn, "peer_qpn": link.peer_qpn,
                      "gid": _gid(ldev.gid), "peer_gid": _gid(link.peer_gid),
                      "link_uid": f"{lgr.lgr_id:06x}{link.link_id:02x}",
                      "peer_uid": bytes(lgr.peer_id).hex()[:8] or "-",
                      "device": ldev.name, "port": 1, "netdev": ldev.netdev or "-"})  # fmt: skip
    return {"lgr_id": lgr.lgr_id, "role": str(lgr.role.value), "type": str(lgr.lgr_type.value),
            "vlan": 0, "conns": len(lgr.conns), "pnet_id": getattr(lgr, "pnet_id", "") or "-",
            "device": dev.name, "netdev": dev.netdev or "-", "links": links}  # fmt: skip


def snapshot() -> dict[str, Any]:
    """The whole answer to ``{"op": "snapshot"}``."""
    partial: list[str] = []
    rows, lgrs, devices, live = gather(partial)
    return {"process": process_info(), "sockets": rows, "linkgroups": lgrs,
            "devices": devices, "partial": partial,
            "counters": COUNTERS.to_dict(live["tx"], live["rx"], live["peer_full"])}  # fmt: skip


def counters() -> dict[str, Any]:
    """This process's counters, live connections' bytes included (``{"op": "counters"}``)."""
    partial: list[str] = []
    live = {"tx": 0, "rx": 0, "peer_full": 0}
    for stack in _stacks():
        if not stack.lock.acquire(timeout=LOCK_WAIT):
            partial.append(f"runtime {stack.device.name} busy")
            continue
        try:
            _add_live(stack, live)
        finally:
            stack.lock.release()
    return {"process": process_info(), "partial": partial,
            "counters": COUNTERS.to_dict(live["tx"], live["rx"], live["peer_full"])}  # fmt: skip


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's answer to a (checked) request."""
    op = request["op"]
    if op == "snapshot":
        return snapshot()
    if op == "counters":
        return counters()
    return {"process": process_info()}
