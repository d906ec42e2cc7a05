"""``smcr top``: a live view of every smcr process's link groups, links and connections.

Beyond smc-tools: each refresh asks every process (:mod:`smcr.diag`) and shows
each connection's send and receive rates, from the byte counts of two
successive looks (a connection is known by pid and socket inode).  ``-n N``
stops after N refreshes (``--json`` prints the last look, rates included).
Without a terminal (a pipe, a file) the tables take the width their cells
need, nothing cut at 80 columns (:data:`UNBOUNDED`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from smcr.diag import client
from smcr.tools import diagview

UNBOUNDED = 10_000
"""The console width without a terminal: wider than any table, which then keeps the
width its cells need (rich's default there is 80 columns, and cells were cut)."""


def sample() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Connections (with pid), link groups (with pid) and processes, once."""
    replies, procs = diagview.gather("snapshot")
    conns: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for reply in replies:
        who = diagview.owner(reply)
        for raw in client.rows_of(reply, "sockets"):
            row = diagview.clean(raw)
            row.update(pid=who["pid"], command=who["command"])
            conns.append(row)
        for raw in client.rows_of(reply, "linkgroups"):
            group = diagview.clean(raw)
            links = raw.get("links")
            group["links"] = len(links) if isinstance(links, list) else 0
            group.update(pid=who["pid"], command=who["command"])
            groups.append(group)
    return conns, groups, procs


def add_rates(conns: list[dict[str, Any]], before: dict[tuple[int, int], tuple[int, int]],
              seconds: float) -> dict[tuple[int, int], tuple[int, int]]:  # fmt: skip
    """Set ``tx_rate``/``rx_rate`` (bytes/s) from the last look; the byte counts of this one."""
    now = {}
    for c in conns:
        key = (c["pid"], c.get("inode", 0))
        tx, rx = c.get("tx_bytes", 0), c.get("rx_bytes", 0)
        now[key] = (tx, rx)
        if key in before and seconds > 0:
            c["tx_rate"] = max(0, tx - before[key][0]) / seconds
            c["rx_rate"] = max(0, rx - before[key][1]) / seconds
    return now


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B/s"


def _cells(*values: object) -> list[Text]:
    """Table cells as plain text: a string from another process (a command name, an
    error) is not rich markup, which would crash the view (``[/x]``: MarkupError) or
    put escape sequences on the terminal (``[link=...]``: OSC 8)."""
    return [Text(str(v)) for v in values]


def view(conns: list[dict[str, Any]], groups: list[dict[str, Any]],
         procs: list[dict[str, Any]], expand: bool = True) -> Group:  # fmt: skip
    """The three tables, as wide as the terminal (``expand``) or as their cells.  Every cell
    is plain text (:func:`_cells`): what other processes said must not be read as rich
    markup."""
    pt = Table(title=f"smcr processes ({len(procs)})", expand=expand)
    for col in ("PID", "Command", "Netns", "Status"):
        pt.add_column(col)
    for p in procs:
        pt.add_row(*_cells(str(p["pid"]), str(p.get("command", "?")), str(p.get("netns", "-")),
                   str(p.get("error", "ok"))))  # fmt: skip
    gt = Table(title="link groups", expand=expand)
    for col in ("PID", "LG-ID", "LG-Role", "LG-Type", "#Links", "#Conns", "IB-Dev"):
        gt.add_column(col)
    for g in groups:
        gt.add_row(*_cells(str(g["pid"]), f"{g.get('lgr_id', 0):08x}", str(g.get("role", "-")),
                   str(g.get("type", "-")), str(g["links"]), str(g.get("conns", 0)),
                   str(g.get("device", "-"))))  # fmt: skip
    ct = Table(title="connections", expand=expand)
    for col in ("PID", "State", "Local Address", "Peer Address", "Mode", "TX", "RX"):
        ct.add_column(col)
    for c in conns:
        mode = c.get("mode", "-")
        if mode == "TCP" and c.get("state") != "LISTEN":
            mode = f"TCP 0x{c.get('local_code', 0):08x}/0x{c.get('peer_code', 0):08x}"
        ct.add_row(*_cells(str(c["pid"]), str(c.get("state", "-")), str(c.get("local", "-")),
                   str(c.get("peer", "-")), str(mode), _rate(c.get("tx_rate")),
                   _rate(c.get("rx_rate"))))  # fmt: skip
    return Group(pt, gt, ct)


def run(args: argparse.Namespace) -> int:
    """Refresh every ``--interval`` seconds until Ctrl-C (or ``-n`` refreshes)."""
    console = Console()
    terminal = console.is_terminal
    if not terminal:
        console = Console(width=UNBOUNDED)
    before: dict[tuple[int, int], tuple[int, int]] = {}
    last = time.monotonic()
    conns, groups, procs = sample()
    before = add_rates(conns, before, 0.0)
    count = 1
    if args.json:
        if args.iterations != 1:
            time.sleep(args.interval)
            conns, groups, procs = sample()
            add_rates(conns, before, time.monotonic() - last)
        diagview.dump({"connections": conns, "linkgroups": groups, "processes": procs})
        return 0
    try:
        with Live(view(conns, groups, procs, terminal), console=console,
                  auto_refresh=False) as live:  # fmt: skip
            while args.iterations == 0 or count < args.iterations:
                time.sleep(args.interval)
                conns, groups, procs = sample()
                now = time.monotonic()
                before = add_rates(conns, before, now - last)
                last = now
                count += 1
                live.update(view(conns, groups, procs, terminal), refresh=True)
    except KeyboardInterrupt:
        pass
    return 0
