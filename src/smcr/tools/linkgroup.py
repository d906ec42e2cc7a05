"""``smcr linkgroup show|link-show [-d]``: link groups and links of every smcr process.

smc-tools' columns: ``show``: ``LG-ID LG-Role LG-Type VLAN #Conns PNET-ID``,
``-d`` adds the group's links (``#Links``, their states and RNICs), ``-dd``
their GIDs; ``link-show``: ``LG-ID LG-Role LG-Type Net-Dev Link-State #Conns``,
``-d`` adds ``Link-UID Peer-UID IB-Dev IB-P``, ``-dd`` ``Local-GID Peer-GID``.
Link group ids are per process in smcr (each process has its own engine), hence
the ``PID`` column.
"""

from __future__ import annotations

import argparse
from typing import Any

from smcr.diag import client
from smcr.tools import diagview


def collect() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every process's link groups (cleaned, each with its links and pid)."""
    replies, procs = diagview.gather("snapshot")
    groups = []
    for reply in replies:
        who = diagview.owner(reply)
        for raw in client.rows_of(reply, "linkgroups"):
            group = diagview.clean(raw)
            links = raw.get("links")
            group["links"] = [diagview.clean(link) for link in links[:16]
                              if isinstance(link, dict)] if isinstance(links, list) else []
            group.update(pid=who["pid"], command=who["command"])
            groups.append(group)
    return groups, procs


def table(groups: list[dict[str, Any]], links: bool, detail: int) -> str:
    """``show`` or ``link-show`` as smc-tools prints them."""
    if not links:
        return _groups(groups, detail)
    head = ["LG-ID", "LG-Role", "LG-Type", "Net-Dev", "Link-State", "#Conns"]
    if detail:
        head += ["Link-UID", "Peer-UID", "IB-Dev", "IB-P"]
    if detail > 1:
        head += ["Local-GID", "Peer-GID"]
    rows = []
    for g in groups:
        for link in g["links"]:
            row = [f"{g.get('lgr_id', 0):08x}", g.get("role", "-"), g.get("type", "-"),
                   link.get("netdev", "-"), link.get("state", "-"), link.get("conns", 0)]
            if detail:
                row += [link.get("link_uid", "-"), link.get("peer_uid", "-"),
                        link.get("device", "-"), link.get("port", 1)]
            if detail > 1:
                row += [link.get("gid", "-"), link.get("peer_gid", "-")]
            rows.append([*row, g["pid"], g["command"]])
    return diagview.render([*head, "PID", "Command"], rows)


def _groups(groups: list[dict[str, Any]], detail: int) -> str:
    """``show``: one row per link group; ``-d`` its links, ``-dd`` their GIDs too."""
    head = ["LG-ID", "LG-Role", "LG-Type", "VLAN", "#Conns", "PNET-ID"]
    if detail:
        head += ["#Links", "Link-States", "IB-Devs"]
    if detail > 1:
        head += ["Local-GIDs", "Peer-GIDs"]
    rows = []
    for g in groups:
        row = [f"{g.get('lgr_id', 0):08x}", g.get("role", "-"), g.get("type", "-"),
               g.get("vlan", 0), g.get("conns", 0), g.get("pnet_id", "-")]  # fmt: skip

        def each(key: str, g: dict[str, Any] = g) -> str:
            return ",".join(str(link.get(key, "-")) for link in g["links"]) or "-"

        if detail:
            row += [len(g["links"]), each("state"), each("device")]
        if detail > 1:
            row += [each("gid"), each("peer_gid")]
        rows.append([*row, g["pid"], g["command"]])
    return diagview.render([*head, "PID", "Command"], rows)


def run(args: argparse.Namespace) -> int:
    """Print the table (or ``--json``); 0."""
    groups, procs = collect()
    if args.json:
        diagview.dump({"linkgroups": groups, "processes": procs})
        return 0
    diagview.warn_errors(procs)
    print(table(groups, args.action == "link-show", args.detail))
    return 0
