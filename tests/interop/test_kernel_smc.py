"""Discovery against the Linux kernel's SMC (issue 11): the SMC TCP option both ways, then CLC.

The guest (kernel 6.12, rxe0, pnet SMCNET eth0<->rxe0, UEID SMC-KVM-TEST, as
``shared/interop/tools/smc-setup.sh`` sets it up) runs AF_SMC or plain TCP
sockets (``harness/tools/kernel_smc.py``); smcr runs in netns smcnet at
10.99.0.1 with discovery by the TCP option (the test session's ``smcr
enable``) and its RoCE RNIC (``tests/interop/smc_host.py``), through
:func:`tests.interop.kernel_exchange.exchange`.  Every exchange is one
connection: the client sends 1 MiB of a seeded pattern, the server echoes it,
both compare SHA-256; tcpdump on br0 records the TCP stream.

What the capture proves: the SYN and the SYN-ACK carried the option (kind 254,
length 6, ExID 0xE2D4C3D9), the client's stream starts with a CLC Proposal and
the declining side's with a CLC Decline, and after those messages each stream
is exactly the application's bytes.  The decline code is read three times --
on the wire, in the declining side's record, in the other side's -- and must
agree: the declining side keeps it as its local reason, the other side keeps
``PEERDECL`` (0x05000000) with it as the peer's diagnosis, as ``smcss`` shows
``<local>/<remote>``.

Why both directions decline here: smcr has no UEID configured (an empty table:
the host's ``/etc/smcr/ueid`` does not count), so it speaks
SMC-Rv1 only, and the kernel over rxe (RoCE v2 GIDs only) only SMC-Rv2.  The
kernel's Proposal offers SMC-Rv2 alone (typev1 N), which smcr declines with
NOSMCDEV (no common UEID, as a Linux server does); smcr's offers SMC-Rv1 alone,
which the kernel declines with NOSMCDEV (it finds no RoCE v1 GID).  With the
guests' UEID configured on smcr's side these connections run SMC-Rv2
(``test_kernel_smcr.py``).

The controls: a plain TCP guest socket, or smcr with ``SMCR_DISCOVERY=off``
against a kernel AF_SMC socket, give ``PEERNOSMC`` (0x03010000) on every
SMC end and not one CLC byte on the wire.
"""

from __future__ import annotations

import pytest

from smcr.wire.clc import ClcDecline, ClcProposal, make_eid
from smcr.wire.clc_header import SmcType
from smcr.wire.decline import DeclineCode
from tests.interop.guest import Guest
from tests.interop.kernel_exchange import MB, Exchange, check_data, exchange

pytestmark = [pytest.mark.interop, pytest.mark.root]

PEERNOSMC = int(DeclineCode.PEERNOSMC)
PEERDECL = int(DeclineCode.PEERDECL)
NOSMCDEV = int(DeclineCode.NOSMCDEV)


def run(guest: Guest, guest_role: str, family: str, discovery: str = "bpf") -> Exchange:
    """One 1 MiB echo connection, smcr without a UEID; its data checked."""
    ex = exchange(guest, guest_role, family, discovery, nbytes=MB)
    check_data(ex, MB)
    return ex


def server_decline(ex: Exchange) -> int:
    """The code of the server's Decline: the one CLC message each way is the client's
    Proposal and the server's Decline (no answer to it)."""
    assert len(ex.client_clc) == 1 and isinstance(ex.client_clc[0], ClcProposal), ex.client_clc
    assert len(ex.server_clc) == 1 and isinstance(ex.server_clc[0], ClcDecline), ex.server_clc
    return ex.server_clc[0].peer_diagnosis


# -------------------------------------------------------------------- tests


def test_kernel_client_to_smcr_server_declined_by_smcr(kernel_smc: Guest) -> None:
    ex = run(kernel_smc, "client", "smc")
    assert ex.host["discovery"] == "bpf"
    assert ex.wire.c2s.syn_option and ex.wire.s2c.syn_option  # each end saw the other's option
    # the kernel's Proposal: SMC-Rv2 only (rxe has RoCE v2 GIDs only), its GID and UEID
    code = server_decline(ex)
    prop = ex.client_clc[0]
    assert isinstance(prop, ClcProposal)
    assert (prop.version, prop.typev1, prop.typev2) == (2, SmcType.N, SmcType.R), prop
    assert prop.v2_extension is not None
    assert prop.v2_extension.user_eids == (make_eid("SMC-KVM-TEST"),)
    assert prop.v2_extension.roce_gid == bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 11])
    # smcr has no matching UEID and declines as a Linux server then does: NOSMCDEV
    # 0x03030000 (smc_listen_find_device; NOUEID only for a Proposal with no UEID at all)
    assert code == NOSMCDEV
    assert ex.smcr["info"] == {"mode": "TCP", "local_code": NOSMCDEV, "peer_code": 0}
    diag = ex.kernel["diag"]
    assert diag["mode"] == "FALLBACK_TCP", diag
    assert (diag["fallback_reason"], diag["peer_diagnosis"]) == (PEERDECL, NOSMCDEV), diag


def test_smcr_client_to_kernel_server_declined_by_the_kernel(kernel_smc: Guest) -> None:
    ex = run(kernel_smc, "server", "smc")
    assert ex.host["discovery"] == "bpf"
    assert ex.wire.c2s.syn_option and ex.wire.s2c.syn_option
    # smcr's Proposal: SMC-Rv1 only, in a v2 header, with its RoCE GID and the /24 prefix
    code = server_decline(ex)
    prop = ex.client_clc[0]
    assert isinstance(prop, ClcProposal)
    assert (prop.version, prop.typev1, prop.typev2) == (2, SmcType.R, SmcType.N), prop
    assert prop.gid == bytes(10) + b"\xff\xff" + bytes([10, 99, 0, 1])
    # the kernel finds no RoCE v1 GID for SMC-Rv1 and declines with NOSMCDEV; what it
    # sends is what it records (smc_diag), and smcr keeps it as the peer's diagnosis
    assert code == NOSMCDEV
    diag = ex.kernel["diag"]
    assert diag["mode"] == "FALLBACK_TCP", diag
    assert (diag["fallback_reason"], diag["peer_diagnosis"]) == (NOSMCDEV, 0), diag
    assert ex.smcr["info"] == {"mode": "TCP", "local_code": PEERDECL, "peer_code": NOSMCDEV}


@pytest.mark.parametrize(("guest_role", "family", "discovery"), [
    ("client", "tcp", "bpf"),  # plain TCP guest client, smcr server
    ("server", "tcp", "bpf"),  # smcr client, plain TCP guest server
    ("client", "smc", "off"),  # kernel SMC client, smcr server without the option
    ("server", "smc", "off"),  # smcr client without the option, kernel SMC server
])  # fmt: skip
def test_no_option_no_clc_peernosmc(kernel_smc: Guest, guest_role: str, family: str,
                                    discovery: str) -> None:  # fmt: skip
    ex = run(kernel_smc, guest_role, family, discovery)
    assert ex.host["discovery"] == discovery
    smcr_asks = discovery == "bpf"
    kernel_asks = family == "smc"
    client_asks = kernel_asks if guest_role == "client" else smcr_asks
    assert ex.wire.c2s.syn_option is client_asks
    assert ex.wire.s2c.syn_option is False  # a SYN-ACK has it only if the SYN had it
    assert ex.client_clc == [] and ex.server_clc == []  # not one CLC byte either way
    assert ex.smcr["info"] == {"mode": "TCP", "local_code": PEERNOSMC, "peer_code": 0}
    if family == "smc":
        diag = ex.kernel["diag"]
        assert diag["mode"] == "FALLBACK_TCP", diag
        assert (diag["fallback_reason"], diag["peer_diagnosis"]) == (PEERNOSMC, 0), diag
    else:
        assert ex.kernel["diag"] is None
