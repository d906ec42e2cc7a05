"""smcr over the guest's verbs device (rxe0 through pyverbs, ``SMCR_RNIC=verbs``) against
smcr's own RoCE RNIC on the host: the same wire, both roles.

The guest runs ``harness/tools/smcr_end.py`` (smcr's sockets over
:class:`~smcr.rdma.ibverbs.device.VerbsDevice`, the repository's ``src/`` copied into the
guest's share, compiled modules included where they match the sources); the host runs
``tests/interop/smc_host.py`` with ``SMCR_RNIC=roce``, as against the kernel.  Both find
each other by the peer list (``SMCR_DISCOVERY=policy``), and speak SMC-Rv1 (no UEID).
The guests run under QEMU without KVM: the figures say that it works, not how fast.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

import pytest

from tests.interop.guest import FIGURES, Guest
from tests.interop.kernel_exchange import MB, Exchange, check_data, exchange
from tests.roce.netns import REPO

pytestmark = [pytest.mark.root, pytest.mark.interop]

TOOL = "python3 /mnt/host/tools/smcr_end.py"
PEERS = "10.99.0.0/24"
GUEST_ENV = f"SMCR_DISCOVERY=policy SMCR_PEERS={PEERS}"
HOST_GID = "00000000000000000000ffff0a630001"
GUEST_GID = "00000000000000000000ffff0a63000b"


@pytest.fixture(scope="module")
def verbs_guest(rxe_guest: Guest) -> Guest:
    """The guest with smcr's sources in its share (``/mnt/host/src``)."""
    target = rxe_guest.share / "src"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(REPO / "src" / "smcr", target / "smcr",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return rxe_guest


def run(guest: Guest, guest_role: str, **kw: Any) -> Exchange:
    """An exchange between smcr in the guest (verbs) and smcr on the host (RoCE)."""
    return exchange(guest, guest_role, "smcr", discovery="policy", tool=TOOL,
                    guest_env=GUEST_ENV, env={"SMCR_PEERS": PEERS}, **kw)  # fmt: skip


def check_verbs(ex: Exchange, i: int = 0) -> None:
    """Connection ``i`` ran SMC-R on both ends, the guest's over rxe0 through verbs."""
    host, guest = ex.host["conns"][i]["info"], ex.guest["conns"][i]["info"]
    assert host["mode"] == guest["mode"] == "SMCR", (host, guest)
    assert guest["rnic"] == {"kind": "VerbsDevice", "name": "rxe0"}, guest
    assert (guest["lgr"]["gid"], guest["lgr"]["peer_gid"]) == (GUEST_GID, HOST_GID), guest
    assert (host["lgr"]["gid"], host["lgr"]["peer_gid"]) == (HOST_GID, GUEST_GID), host
    assert guest["lgr"]["qpn"] == host["lgr"]["peer_qpn"], (host, guest)
    assert host["lgr"]["qpn"] == guest["lgr"]["peer_qpn"], (host, guest)
    assert guest["lgr"]["role"] == ("CLIENT" if ex.guest_role == "client" else "SERVER")


@pytest.mark.parametrize("guest_role", ["client", "server"])
def test_smcr_over_verbs_with_smcr_roce_echo(verbs_guest: Guest, guest_role: str) -> None:
    """4 MiB each way through the guest's RMB, which rxe writes (the RDMA WRITEs of the
    host's RNIC) and the program reads; every byte intact, none of them on TCP."""
    t0 = time.monotonic()
    ex = run(verbs_guest, guest_role, nbytes=4 * MB)
    check_verbs(ex)
    check_data(ex, 4 * MB, smc=True)
    FIGURES[f"verbs_echo_4mib_guest_{guest_role}_s"] = round(time.monotonic() - t0, 2)
    assert ex.host["rnic"]["icrc_errors"] == 0, ex.host["rnic"]


def test_smcr_over_verbs_connections_reuse_the_link_group(verbs_guest: Guest) -> None:
    """20 connections one after another: the first makes the link group, the others join
    it (no new QP), each echoing 64 KiB intact; then a ping-pong over one more."""
    ex = run(verbs_guest, "client", nbytes=64 << 10, count=20)
    check_data(ex, 64 << 10, smc=True)
    lgrs = set()
    for i in range(20):
        check_verbs(ex, i)
        info = ex.guest["conns"][i]["info"]
        assert info["first_contact"] is (i == 0), (i, info)
        lgrs.add((info["lgr_id"], info["lgr"]["qpn"]))
    assert len(lgrs) == 1, lgrs
    pp = run(verbs_guest, "client", mode="pingpong", iters=200, size=32)
    check_verbs(pp)
    rec = pp.guest["conns"][0]
    assert rec["echoed_intact"] == 200, rec
    FIGURES["verbs_pingpong_32b_rtt_us"] = round(rec["pingpong_seconds"] / 200 * 1e6, 1)
