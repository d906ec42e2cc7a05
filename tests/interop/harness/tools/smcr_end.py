"""Guest side of the verbs RNIC tests: smcr's sockets in the guest, over rxe0 through pyverbs.

Runs *inside* the QEMU guest as ``python3 smcr_end.py server|client ...`` with the options
of ``kernel_smc.py`` (``--family`` is taken and ignored: this end is always smcr's
``SMCSocket``), so the host-side helpers (``tests/interop/kernel_exchange.py``) drive it
as they drive the kernel's end.  smcr is the repository's ``src/`` that the test copied
to ``/mnt/host/src``; ``SMCR_RNIC=verbs`` is the default here, so smcr uses the guest's
RDMA device (rxe0, the one whose RoCE v2 GID is eth0's address).

What server and client do is ``exchange_end.py`` beside this file.  Each prints one JSON
line at the end: per connection ``smc_info()`` and, for SMC-R, the link group as smcr's
engine holds it and the RNIC under it (kind and name).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from typing import TYPE_CHECKING, Any

sys.path.insert(0, "/mnt/host/src")
os.environ.setdefault("SMCR_RNIC", "verbs")


if TYPE_CHECKING:  # the project's mypy reads this file as part of the tests package
    from tests.interop.harness.tools.exchange_end import (
        Stack,
        add_exchange_args,
        client,
        serve,
        smcr_description,
    )
else:  # in the guest: the shared end is beside this file
    from exchange_end import Stack, add_exchange_args, client, serve, smcr_description

import smcr
from smcr.socket import SMCSocket
from smcr.stack.runtime import get_stack


def local_ipv4() -> str:
    """eth0's IPv4 address (the guest agent set it from the kernel command line)."""
    with open("/proc/cmdline") as f:
        for word in f.read().split():
            if word.startswith("guestip="):
                return word.split("=", 1)[1].split("/", 1)[0]
    raise LookupError("no guestip= on the kernel command line")


def info(sock: SMCSocket) -> dict[str, Any]:
    """``smc_info()``, and for SMC-R the link group and the RNIC as smcr holds them
    (:func:`smcr_description`)."""
    return smcr_description(sock, lambda address: get_stack(ipaddress.ip_address(address)))


def smcr_stack() -> Stack:
    """This end: smcr's sockets, described by :func:`info`."""
    return Stack("smcr", "info", info,
                 lambda a: smcr.create_connection((a.host, a.port), timeout=a.timeout))


def server(a: argparse.Namespace) -> dict[str, Any]:
    srv = smcr.create_server((local_ipv4(), a.port))
    print(json.dumps({"listening": a.port}), flush=True)
    try:
        return serve(srv, a, smcr_stack())
    finally:
        srv.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["server", "client"])
    p.add_argument("--family", default="smcr")
    add_exchange_args(p, "10.99.0.1", ["echo", "send", "pingpong", "hold", "abort"])
    a = p.parse_args()
    print(json.dumps({"pid": os.getpid()}), flush=True)
    result = server(a) if a.cmd == "server" else client(a, smcr_stack())
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
