"""``smcr stats [show|reset|json] [-d] [-a]``: smc-tools' SMC-R counters, host totals.

Totals are the running processes' counters (each asked, :mod:`smcr.diag`) plus
those that processes left when they exited (:mod:`smcr.diag.store`); without
``-a`` the baseline of the last ``reset`` is taken off.  ``reset`` writes that
baseline into this user's private directory: root's covers every user's
processes, a user's their own.  Sections and lines as smc-tools prints them
(``SMC-R Connections Summary``, ``RX Stats``, ``TX Stats``, ``Extras``).
"""

from __future__ import annotations

import argparse
from typing import Any

from smcr.diag import client, paths, store
from smcr.stack.counters import BUCKETS
from smcr.tools import diagview
from smcr.wire.decline import describe


def totals() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Running and exited processes' counters summed, and the process list."""
    replies, procs = diagview.gather("counters")
    total: dict[str, Any] = {}
    for reply in replies:
        raw = (reply.answer or {}).get("counters")
        if isinstance(raw, dict):
            total = store.add(total, store.clean(raw))
    for directory, _uid in paths.visible_directories():
        total = store.add(total, store.fold_exited(directory))
    return total, procs


def current(absolute: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The counters to show: since the last reset, or (``absolute``) all."""
    total, procs = totals()
    if not absolute:
        with_base = store.load_baseline(paths.own_directory())
        if with_base:
            total = store.add(total, with_base, -1)
    return _complete(total), procs


def _complete(c: dict[str, Any]) -> dict[str, Any]:
    """Every field present (a host with no smcr process shows zeros)."""
    for key in ("tx_pd", "rx_pd", "tx_rmbsize", "rx_rmbsize"):
        value = c.get(key) or []
        c[key] = (list(value) + [0] * len(BUCKETS))[: len(BUCKETS)]
    for key in ("clnt_fback", "srv_fback"):
        c.setdefault(key, [])
    for key in ("clnt_v1_succ_cnt", "clnt_v2_succ_cnt", "srv_v1_succ_cnt", "srv_v2_succ_cnt",
                "clnt_hshake_err_cnt", "srv_hshake_err_cnt", "tx_bytes", "rx_bytes",
                "tx_buf_full_cnt", "tx_buf_full_peer_cnt", "rx_buf_full_cnt", "urg_data_cnt",
                "cork_cnt", "ndly_cnt", "sendfile_cnt", "bell_cnt", "inplace_cnt",
                "late_news_cnt", "trimmed_bytes", "clc_spin_cnt"):  # fmt: skip
        c.setdefault(key, 0)
    c["clnt_fback_cnt"] = sum(r["count"] for r in c["clnt_fback"])
    c["srv_fback_cnt"] = sum(r["count"] for r in c["srv_fback"])
    c["tx_cnt"], c["rx_cnt"] = sum(c["tx_pd"]), sum(c["rx_pd"])
    return c


def _short(n: int) -> str:
    """smc-tools' abbreviation in 6 characters: 1234567 -> 1.23M."""
    for unit, size in (("T", 10**12), ("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            for digits in (2, 1, 0):
                text = f"{n / size:.{digits}f}{unit}"
                if len(text) <= 6:
                    return text
    return str(n)


def _hist(label: str, values: list[int]) -> str:
    folded = [*values[:7], values[7] + values[8]]  # smc-tools: >512KB is 1024K and beyond
    return f"  {label}   " + "  ".join(f"{_short(v):>6}" for v in folded)


def text(c: dict[str, Any], detail: int) -> str:
    """The counters as ``smcr stats show`` of smc-tools prints them."""
    smc = (c["clnt_v1_succ_cnt"] + c["clnt_v2_succ_cnt"] + c["srv_v1_succ_cnt"]
           + c["srv_v2_succ_cnt"])
    errors = c["clnt_hshake_err_cnt"] + c["srv_hshake_err_cnt"]
    fback = c["clnt_fback_cnt"] + c["srv_fback_cnt"]
    avg = (c["rx_cnt"] + c["tx_cnt"]) / smc if smc else 0.0
    special = c["cork_cnt"] + c["ndly_cnt"] + c["sendfile_cnt"] + c["urg_data_cnt"]

    def pct(n: int, of: int) -> str:
        return f"{n / of * 100 if of else 0:.2f}%"

    out = ["SMC-R Connections Summary", f"  Total connections handled  {smc + errors + fback:12d}"]
    if detail:
        out += [f"  SMC connections            {smc:12d} (client "
                f"{c['clnt_v1_succ_cnt'] + c['clnt_v2_succ_cnt']}, server "
                f"{c['srv_v1_succ_cnt'] + c['srv_v2_succ_cnt']})",
                f"    v1                       {c['clnt_v1_succ_cnt'] + c['srv_v1_succ_cnt']:12d}",
                f"    v2                       {c['clnt_v2_succ_cnt'] + c['srv_v2_succ_cnt']:12d}",
                f"  Handshake errors           {errors:12d} (client {c['clnt_hshake_err_cnt']}, "
                f"server {c['srv_hshake_err_cnt']})"]  # fmt: skip
    else:
        out += [f"  SMC connections            {smc:12d}",
                f"  Handshake errors           {errors:12d}"]  # fmt: skip
    out.append(f"  Avg requests per SMC conn  {avg:14.1f}")
    if detail:
        out.append(f"  TCP fallback               {fback:12d} (client {c['clnt_fback_cnt']}, "
                   f"server {c['srv_fback_cnt']})")  # fmt: skip
        for side, key in (("Server", "srv_fback"), ("Client", "clnt_fback")):
            reasons = sorted(c[key], key=lambda r: -r["count"])
            if reasons:
                out.append(f"    {side}")
            for r in reasons:
                code = f"0x{r['local']:08x}/0x{r['peer']:08x}"
                why = describe(r["local"] or r["peer"]).split(":", 1)[-1].strip()[:40]
                out.append(f"     {code}  {r['count']:12d}  {why}")
    else:
        out.append(f"  TCP fallback               {fback:12d}")
    head = "            8KB    16KB    32KB    64KB   128KB   256KB   512KB  >512KB"
    out += ["", "RX Stats",
            f"  Data transmitted (Bytes) {c['rx_bytes']:14d} ({_short(c['rx_bytes'])})",
            f"  Total requests             {c['rx_cnt']:12d}",
            f"  Buffer full                {c['rx_buf_full_cnt']:12d} "
            f"({pct(c['rx_buf_full_cnt'], c['rx_cnt'])})",
            head, _hist("Bufs", c["rx_rmbsize"]), _hist("Reqs", c["rx_pd"]),
            "", "TX Stats",
            f"  Data transmitted (Bytes) {c['tx_bytes']:14d} ({_short(c['tx_bytes'])})",
            f"  Total requests             {c['tx_cnt']:12d}",
            f"  Buffer full                {c['tx_buf_full_cnt']:12d} "
            f"({pct(c['tx_buf_full_cnt'], c['tx_cnt'])})",
            f"  Buffer full (remote)       {c['tx_buf_full_peer_cnt']:12d} "
            f"({pct(c['tx_buf_full_peer_cnt'], c['tx_cnt'])})",
            head, _hist("Bufs", c["tx_rmbsize"]), _hist("Reqs", c["tx_pd"]),
            "", "Extras", f"  Special socket calls       {special:12d}"]  # fmt: skip
    if detail:
        out += [f"    cork                     {c['cork_cnt']:12d}",
                f"    nodelay                  {c['ndly_cnt']:12d}",
                f"    sendfile                 {c['sendfile_cnt']:12d}",
                f"    urgent data              {c['urg_data_cnt']:12d}",
                f"  Rung by the peer           {c['bell_cnt']:12d} (wake-ups of waiting "
                "event loops, shm)",
                f"  CDCs read in place         {c['inplace_cnt']:12d} (no receive "
                "completion, shm)",
                f"  Heard at a look-in         {c['late_news_cnt']:12d} (news nobody "
                "was rung for: up to 10 ms late)",
                f"  Handshake steps caught     {c['clc_spin_cnt']:12d} (an Accept or "
                "Confirm watched for, no sleep)",
                f"  Given back when quiet      {_short(c['trimmed_bytes']):>12} (bytes of "
                "peers' RMBs quiet connections had written)"]  # fmt: skip
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """``show`` (default), ``json`` or ``reset``."""
    if args.action == "reset":
        total, _ = totals()
        directory = paths.ensure_private(paths.own_directory())
        store.save_baseline(directory, total)
        print("smcr stats: counters reset (baseline in " f"{directory / paths.BASELINE})")
        return 0
    counters, procs = current(args.absolute)
    if args.action == "json" or args.json:
        diagview.dump({"SMCR": counters, "since_reset": not args.absolute,
                       "processes": procs})  # fmt: skip
        return 0
    diagview.warn_errors(procs)
    print(text(counters, args.detail))
    return 0


__all__ = ["client", "current", "run", "text", "totals"]
