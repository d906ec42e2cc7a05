"""What a process tells about itself in its diag snapshot (smcr.diag.snapshot)."""

from __future__ import annotations

import gc
import os
import socket
import warnings
from types import SimpleNamespace as Ns

from smcr.core.close import SmcState
from smcr.diag.snapshot import _smc_row, process_info


def test_process_info_closes_what_it_opens() -> None:
    """It reads /proc/self/comm; an unclosed file warns (ResourceWarning), which a test
    suite run under ``smcr run`` then reports (tornado's does, as an error)."""
    gc.collect()  # what earlier tests left unclosed warns now, not below
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        info = process_info()
        gc.collect()
    assert [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)
            and "/proc/self/comm" in str(w.message)] == []  # fmt: skip
    with open("/proc/self/comm") as f:
        assert info["comm"] == f.read().strip()
    assert info["pid"] == os.getpid()


def test_a_connection_row_names_the_rnic_of_its_link() -> None:
    """``smcr ss -R`` of a runtime over two RNICs: a connection on the link over the second
    RNIC shows that RNIC (device, net device, GID), not the runtime's first; one whose
    link is gone (the row of a closing socket) shows the first."""
    first = Ns(name="roce_p0", netdev="p0", gid=bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1]))
    second = Ns(name="roce_p1", netdev="p1", gid=bytes(10) + b"\xff\xff" + bytes([10, 0, 1, 1]))
    link = Ns(lgr=Ns(lgr_id=3), link_id=2, port=1, peer_gid=bytes(16))
    stack = Ns(device=first, ports=[Ns(device=first), Ns(device=second)],
               engine=Ns(links={77: link}))
    ring = Ns(size=65536)
    with socket.socket() as tcp:
        hc = Ns(handshake=Ns(client=True), outcome=None, tcp=tcp)
        c = Ns(qpn=77, state=SmcState.ACTIVE, rmb=ring, sndbuf_size=65536, peer_rmb_size=65536,
               peer_done=False, tx_flags=0, token=1, rx_prod=0, rx_cons=0, rx_flags=0,
               tx_sent=0, peer_cons=0, tx_app=0, tx_fin=0)
        row = _smc_row(stack, hc, c, 0)
        assert row is not None
        assert (row["device"], row["netdev"], row["link_id"]) == ("roce_p1", "p1", 2), row
        assert row["gid"] == "::ffff:10.0.1.1", row
        c.qpn = 78  # its link gone
        row = _smc_row(stack, hc, c, 0)
        assert row is not None and (row["device"], row["link_id"]) == ("roce_p0", 0), row
