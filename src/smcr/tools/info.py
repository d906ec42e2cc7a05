"""``smcr info``: what this smcr and this host can do (smc-tools' ``smcr info``, more).

Versions (smcr, Python, the SMC-R versions spoken), which code runs (compiled or
pure Python, and why), the RNICs, the discovery mode in force and why, the UEIDs,
the buffer sizes a connection gets on each RNIC kind, the limits and timers as a
runtime started here would have them (Linux's defaults, as the engine's
:class:`~smcr.core.Config` has them, with the ``SMCR_*`` variables applied), the
links per link group as configured, and how many smcr processes answer here.
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
    from smcr.stack.runtime import (  # noqa: PLC0415
        default_buffer_size,
        max_links,
        testlink_time,
    )
    from smcr.tools import device  # noqa: PLC0415

    found = discovery.current()
    try:
        eids = [ueid.decode(e) for e in ueid.load()]
    except (OSError, ueid.UeidError):
        eids = []
    config = dataclasses.asdict(Config(testlink_time=testlink_time(), max_links_v2=max_links()))
    buffers = {kind: default_buffer_size(kind) for kind in KINDS}
    return {
        "smcr_version": __version__, "python": platform.python_version(),
        "kernel": platform.release(), "code": native.status().describe(),
        "smc_versions": ["SMC-Rv1", "SMC-Rv2"],
        "rnic_default": rnic_kind(),
        "rnics": [dataclasses.asdict(r) for r in device.rows(rnic_kind())],
        "verbs": device.verbs_reason("verbs"),
        "discovery": {"mode": found.mode, "why": found.why},
        "ueids": eids, "limits": config, "buffers": buffers,
        "link_rnics": link_rnics(rnic_kind()),
        "diag_directory": str(paths.own_directory()),
        "processes": len(client.endpoints()),
    }  # fmt: skip


def link_rnics(kind: str) -> str:
    """The RNICs a runtime of ``kind`` puts the links of a link group on, as configured
    (``SMCR_SHM_RNICS``, ``SMCR_ROCE_DEVS``)."""
    from smcr import settings  # noqa: PLC0415
    from smcr.stack import ports  # noqa: PLC0415

    if kind == "shm":
        count = ports.shm_rnics()
        return f"{count} shm RNIC{'s' if count > 1 else ''} (SMCR_SHM_RNICS)"
    listed = settings.ROCE_DEVS.value(None)
    which = "verbs RNIC (RDMA device)" if kind == "verbs" else "RoCE RNIC"
    if listed is None:
        return f"the {which} of the connection's interface (SMCR_ROCE_DEVS adds more)"
    more = ", ".join(listed) if listed else "every interface with an IPv4 address"
    return f"the {which} of the connection's interface and those of {more} (SMCR_ROCE_DEVS)"


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
    if info["verbs"]:
        print(f"  ({info['verbs']})")
    print(f"Discovery:      {info['discovery']['mode']} ({info['discovery']['why']})")
    print(f"UEIDs:          {', '.join(info['ueids']) or '(none)'}")
    sizes = ", ".join(f"{size >> 10} KiB on {kind}" for kind, size in info["buffers"].items())
    print(f"Buffers:        send buffer and RMB {sizes} (SO_SNDBUF/SO_RCVBUF, smcr run -t/-r "
          "change them)")  # fmt: skip
    print(f"Limits:         {lim['max_conns']} connections per link group")
    print(f"Links:          up to {lim['max_links_v2']} per link group offered in SMC-Rv2.1 "
          f"(SMCR_MAX_LINKS), {lim['max_links']} advertised in SMC-Rv1 CONFIRM LINK; on "
          f"{info['link_rnics']}")  # fmt: skip
    print(f"Timers:         CLC wait {lim['clc_wait']} s, LLC wait {lim['llc_wait']} s, "
          f"TEST LINK every {lim['testlink_time']} s")  # fmt: skip
    print(f"Diag:           {info['processes']} smcr process(es) answer in "
          f"{info['diag_directory']}")  # fmt: skip
    return 0
