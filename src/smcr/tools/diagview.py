"""What the host-wide tools share: ask every smcr process, clean what came back, print tables.

Every value from another process goes through :func:`clean_rows` (known keys
only, strings made printable and bounded, integers checked) before a table or
``--json`` shows it: a process that lies can put wrong numbers in its own
rows, not escape sequences on the terminal or junk in the JSON shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from smcr.diag import client

STR_KEYS = ("state", "mode", "local", "peer", "role", "device", "netdev", "gid", "peer_gid",
            "shutdown", "rx_prod", "rx_cons", "tx_prod", "tx_cons", "tx_prep", "tx_sent",
            "tx_fin", "type", "pnet_id", "link_uid", "peer_uid", "comm", "cmdline", "name")
INT_KEYS = ("local_code", "peer_code", "uid", "inode", "lgr_id", "link_id", "token", "sndbuf",
            "rcvbuf", "peerbuf", "rx_flags", "tx_flags", "tx_bytes", "rx_bytes", "vlan", "conns",
            "qpn", "peer_qpn", "port", "links", "pid", "netns")


def clean(row: dict[str, Any]) -> dict[str, Any]:
    """Known keys only, each of its type (strings printable and bounded)."""
    out: dict[str, Any] = {}
    for key in STR_KEYS:
        if isinstance(row.get(key), str):
            out[key] = client.text(row[key], 120)
    for key in INT_KEYS:
        value = row.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    if isinstance(row.get("crit"), bool):
        out["crit"] = row["crit"]
    return out


def owner(reply: client.Reply) -> dict[str, Any]:
    """pid and command of the process that answered (what smcss does not show)."""
    proc = clean(client.process_of(reply))
    return {"pid": reply.endpoint.pid, "command": proc.get("comm", "?"),
            "netns": proc.get("netns", 0)}  # fmt: skip


def gather(op: str, pid: int | None = None) -> tuple[list[client.Reply], list[dict[str, Any]]]:
    """Answers of every process, and a ``processes`` list (pid, command, error) for JSON."""
    replies = client.gather(op, pid=pid)
    procs = []
    for r in replies:
        entry: dict[str, Any] = {"pid": r.endpoint.pid, "uid": r.endpoint.owner}
        if r.answer is None:
            entry["error"] = client.text(r.error)
        else:
            info = clean(client.process_of(r))
            entry.update(command=info.get("comm", "?"), netns=info.get("netns", 0))
            partial = r.answer.get("partial")
            if isinstance(partial, list) and partial:
                entry["partial"] = [client.text(p) for p in partial[:8]]
        procs.append(entry)
    return [r for r in replies if r.answer is not None], procs


def render(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A plain table (columns sized to their contents, as smc-tools prints them)."""
    lines = [tuple(str(c) for c in head), *(tuple(str(c) for c in r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)  # fmt: skip


def dump(value: Any) -> None:
    """``--json`` output."""
    print(json.dumps(value, indent=1))


def warn_errors(procs: list[dict[str, Any]]) -> None:
    """Processes that did not answer, on standard error (the table goes on without them)."""
    import sys  # noqa: PLC0415

    for p in procs:
        if "error" in p and not str(p["error"]).startswith("stale"):
            print(f"smcr: pid {p['pid']}: no answer ({p['error']})", file=sys.stderr)
