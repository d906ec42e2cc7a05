"""smcr's end of the kernel SMC interop tests: SMCSocket connections in netns ``smcnet``.

``python -m tests.interop.smc_host server --port P [--count K] [--mode echo|send]``
accepts K clients one after another on 10.99.0.1 (prints ``{"listening": P}``
first): ``echo`` echoes each until EOF, ``send`` sends N bytes of the pattern
and closes first.
``python -m tests.interop.smc_host client --host IP --port P [--count K]
[--mode echo|send|pingpong] [--bytes N --seed S] [--iters I --size Z]`` makes K
connections one after another: ``echo`` sends N bytes of the seeded pattern (in
a thread) while reading the echo back, ``send`` reads until EOF, ``pingpong``
times I round trips of Z bytes.
``--mode abort --aborter smcr|kernel`` runs the abort scenarios of
``kernel_smc.py`` (``mid``, ``unread``, ``idle``, then an ``after`` echo), the
same on both ends.
The guest's ``harness/tools/kernel_smc.py`` is the other end; both run the same
``harness/tools/exchange_end.py``: the same modes and the same pattern
(``random.Random(seed + i).randbytes(N)`` for the i-th connection, made in pieces). Both
print one JSON line at the end: per connection ``smc_info()`` right after connect/accept
(and for SMC-R the link group as smcr's engine holds it: version, negotiated EID, peer
GID and host), bytes and SHA-256 each way and seconds; then the discovery mode in force
and the RoCE RNIC's counters (packets, ICRC errors).

The process joins the namespace by ``setns`` (:func:`smcr.tools.netns.enter_netns`),
not ``ip netns exec``: that one remounts ``/sys``, and with it ``/sys/fs/bpf``
where ``smcr enable`` pinned the discovery map.  ``SMCR_RNIC=roce`` (set by the
test) makes smcr use its RoCE RNIC on the connection's address, as it must
against the guest; ``SMCR_DISCOVERY=off`` is the control without the option;
``SMCR_UEID_FILE`` names the UEID table the test gives smcr.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
from typing import Any

import smcr
from smcr import discovery
from smcr.socket import SMCSocket
from smcr.stack.runtime import get_stack
from smcr.tools.netns import enter_netns
from tests.interop.harness.tools.exchange_end import (
    Stack,
    add_exchange_args,
    chunks,
    client,
    serve,
    smcr_description,
)

NETNS = "smcnet"
HOST_IP = "10.99.0.1"


def pattern(seed: int, n: int) -> bytes:
    """The first ``n`` bytes of the pattern, all at once (for a few MiB; :func:`digest`
    for more)."""
    return b"".join(chunks(seed, n))


def digest(seed: int, n: int) -> str:
    """SHA-256 of ``n`` bytes of the pattern, made piece by piece."""
    h = hashlib.sha256()
    for piece in chunks(seed, n):
        h.update(piece)
    return h.hexdigest()


def info(sock: SMCSocket) -> dict[str, Any]:
    """``smc_info()``, and for SMC-R the link group as the engine holds it
    (:func:`smcr_description`)."""
    return smcr_description(sock, lambda address: get_stack(ipaddress.ip_address(address)))


def smcr_stack() -> Stack:
    """This end: smcr's sockets, described by :func:`info`."""
    return Stack("smcr", "info", info,
                 lambda a: smcr.create_connection((a.host, a.port), timeout=a.timeout))


def server(a: argparse.Namespace) -> dict[str, Any]:
    srv = smcr.create_server((HOST_IP, a.port))
    print(json.dumps({"listening": a.port}), flush=True)
    try:
        return serve(srv, a, smcr_stack())
    finally:
        srv.close()


def rnic_stats() -> dict[str, int] | None:
    """The RoCE RNIC's counters on 10.99.0.1 (None if smcr never opened it)."""
    from smcr.stack import runtime  # noqa: PLC0415

    for stack in runtime._stacks.values():
        stats = getattr(stack.device, "stats", None)
        if isinstance(stats, dict):
            return dict(stats)
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["server", "client"])
    add_exchange_args(p, "10.99.0.11", ["echo", "send", "pingpong", "abort", "hold"])
    a = p.parse_args()
    enter_netns(NETNS)
    result = server(a) if a.cmd == "server" else client(a, smcr_stack())
    result["discovery"] = discovery.current().mode
    result["rnic"] = rnic_stats()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
