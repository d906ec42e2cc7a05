"""``smcr info``: what this smcr and this host can do (smc-tools' ``smcr info``, more).

Versions (smcr, Python, the SMC-R versions spoken), the RNICs, the discovery
mode in force and why, the UEIDs, the buffer sizes a connection gets on each RNIC
kind, the limits (Linux's defaults, as the engine's :class:`~smcr.core.Config` has
them, and the one link per group smcr runs today) and how many smcr processes
answer here.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
from typing import Any

from smcr import __version__


def collect() -> dict[str, Any]:
    """Everything ``smcr info`` shows."""
    from smcr import discovery, native, ueid  # noqa: PLC0415
    from smcr.core import Config  # noqa: PLC0415
    from smcr.diag import client, paths  # noqa: PLC0415
    from smcr.stack.devices import KINDS, rnic_kind  # noqa: PLC0415
    from smcr.stack.runtime import default_buffer_size  # noqa: PLC0415
    from smcr.tools import device  # noqa: PLC0415

    found = discovery.current()
    try:
        eids = [ueid.decode(e) for e in ueid.load()]
    except (OSError, ueid.UeidError):
        eids = []
    config = dataclasses.asdict(Config())
    buffers = {kind: default_buffer_size(kind) for kind in KINDS}
    return {
        "smcr_version": __version__, "python": platform.python_version(),
        "kernel": platform.release(), "code": native.status().describe(),
        "smc_versions": ["SMC-Rv1", "SMC-Rv2"],
        "rnic_default": rnic_kind(),
        "rnics": [dataclasses.asdict(r) for r in device.rows(rnic_kind())],
        "discovery": {"mode": found.mode, "why": found.why},
        "ueids": eids, "limits": config, "buffers": buffers, "links_in_use": 1,
        "diag_directory": str(paths.own_directory()),
        "processes": len(client.endpoints()),
    }  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Print the summary (or ``--json``); 0."""
    import json  # noqa: PLC0415

    info = collect()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    lim = info["limits"]
    print(f"smcr {info['smcr_version']} (Python {info['python']}, kernel {info['kernel']})")
    print(f"Code:           {info['code']}")
    print(f"SMC versions:   {', '.join(info['smc_versions'])}")
    print(f"RNICs:          {len(info['rnics'])} (default kind: {info['rnic_default']})")
    for r in info["rnics"]:
        print(f"  {r['name']:<16} {r['type']:<5} {r['netdev']:<10} {r['gid']}")
    print(f"Discovery:      {info['discovery']['mode']} ({info['discovery']['why']})")
    print(f"UEIDs:          {', '.join(info['ueids']) or '(none)'}")
    sizes = ", ".join(f"{size >> 10} KiB on {kind}" for kind, size in info["buffers"].items())
    print(f"Buffers:        send buffer and RMB {sizes} (SO_SNDBUF/SO_RCVBUF, smcr run -t/-r "
          "change them)")  # fmt: skip
    print(f"Limits:         {lim['max_conns']} connections per link group, "
          f"{info['links_in_use']} link per link group (no redundant links yet; "
          f"SMC-Rv1 CONFIRM LINK advertises {lim['max_links']}, SMC-Rv2.1 offers "
          f"{lim['max_links_v2']})")  # fmt: skip
    print(f"Timers:         CLC wait {lim['clc_wait']} s, LLC wait {lim['llc_wait']} s, "
          f"TEST LINK every {lim['testlink_time']} s")  # fmt: skip
    print(f"Diag:           {info['processes']} smcr process(es) answer in "
          f"{info['diag_directory']}")  # fmt: skip
    return 0
