"""``smcr ss``: smcss for every smcr process of the host (smc-tools' columns and words).

Columns as smcss 1.8.5 prints them (``State UID Inode Local Address Peer
Address Intf Mode``; ``-d`` the shutdown state, token, buffers and cursors;
``-R`` SMC-R sockets only with role, RNIC, link id and GIDs), plus the owning
process (``PID``, ``Command``), which smcss lacks since the kernel owns its
sockets.  LISTEN and INIT rows are hidden unless ``-a`` (``-l``: only LISTEN).
Addresses are cut to 23 characters as smcss cuts them unless ``-W``.
"""

from __future__ import annotations

import argparse
from typing import Any

from smcr.diag import client
from smcr.tools import diagview

BASE = ("State", "UID", "Inode", "Local Address", "Peer Address", "Intf", "Mode")
DEBUG = ("Shutd", "Token", "Sndbuf", "Rcvbuf", "Peerbuf", "rxprod-Cursor", "rxcons-Cursor",
         "rxFlags", "txprod-Cursor", "txcons-Cursor", "txFlags", "txprep-Cursor",
         "txsent-Cursor", "txfin-Cursor")  # fmt: skip
SMCR = ("Role", "IB-device", "Port", "Linkid", "GID", "Peer-GID")
OWNER = ("PID", "Command")
ADDR_WIDTH = 23


def mode_text(row: dict[str, Any]) -> str:
    """``SMCR``, or ``TCP 0x<local>/0x<peer>`` (smcss's fallback column)."""
    if row.get("mode") == "TCP" and row.get("state") != "LISTEN":
        return f"TCP 0x{row.get('local_code', 0):08x}/0x{row.get('peer_code', 0):08x}"
    return str(row.get("mode", "-"))


def select(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """smcss's filters: LISTEN/INIT hidden unless -a, -l only LISTEN, -R only SMC-R."""
    out = []
    for row in rows:
        state = row.get("state")
        if args.listening and state != "LISTEN":
            continue
        if not (args.all or args.listening) and state in ("LISTEN", "INIT"):
            continue
        if args.smcr and row.get("mode") != "SMCR":
            continue
        out.append(row)
    return out


def collect(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every process's socket rows (cleaned, with pid and command), and the process list."""
    replies, procs = diagview.gather("snapshot")
    rows = []
    for reply in replies:
        who = diagview.owner(reply)
        for raw in client.rows_of(reply, "sockets"):
            row = diagview.clean(raw)
            row.update(pid=who["pid"], command=who["command"], netns=who["netns"])
            row["mode_text"] = mode_text(row)
            rows.append(row)
    return select(rows, args), procs


def _cut(text: str, wide: bool) -> str:
    return text if wide or len(text) <= ADDR_WIDTH else text[: ADDR_WIDTH - 1] + "*"


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The rows as smcss prints them."""
    head = list(BASE) + (list(DEBUG) if args.debug else []) + (list(SMCR) if args.smcr else [])
    lines = []
    for r in rows:
        line: list[Any] = [r.get("state", "-"), r.get("uid", "-"), r.get("inode", "-"),
                           _cut(r.get("local", "-"), args.wide),
                           _cut(r.get("peer", "-"), args.wide), "-", r["mode_text"]]  # fmt: skip
        if args.debug:
            line += [r.get("shutdown", "-"), f"{r['token']:#010x}" if "token" in r else "-",
                     r.get("sndbuf", "-"), r.get("rcvbuf", "-"), r.get("peerbuf", "-"),
                     r.get("rx_prod", "-"), r.get("rx_cons", "-"),
                     f"{r['rx_flags']:#04x}" if "rx_flags" in r else "-",
                     r.get("tx_prod", "-"), r.get("tx_cons", "-"),
                     f"{r['tx_flags']:#04x}" if "tx_flags" in r else "-",
                     r.get("tx_prep", "-"), r.get("tx_sent", "-"), r.get("tx_fin", "-")]
        if args.smcr:
            line += [r.get("role", "-"), r.get("device", "-"), 1, r.get("link_id", "-"),
                     r.get("gid", "-"), r.get("peer_gid", "-")]
        lines.append([*line, r["pid"], r["command"]])
    return diagview.render([*head, *OWNER], lines)


def run(args: argparse.Namespace) -> int:
    """Print the table (or ``--json``); 0."""
    rows, procs = collect(args)
    if args.json:
        diagview.dump({"sockets": rows, "processes": procs})
        return 0
    diagview.warn_errors(procs)
    print(table(rows, args))
    return 0
