"""The tail of a requester's SEND on the shm RNIC: the peer CQ's mark and arm words, and
the doorbells or consumer bell rung (:mod:`smcr.rdma.shm.cq`, :mod:`smcr.rdma.bells`).
"""

from __future__ import annotations

import socket
from typing import Final

from smcr.rdma.bells import ring_consumer
from smcr.rdma.completion import ARM_SLEEPER, ARM_STANDBY
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm.cq import fence
from smcr.rdma.shm.peer import PeerLink

_U32_PACK: Final = lay.U32.pack_into
_U32_UNPACK: Final = lay.U32.unpack_from


def notify(peer: PeerLink, wake: int = 0) -> None:
    """After a SEND was placed (``produced`` stored): mark the peer QP, and ring the peer's CQ
    if it is armed, with the doorbell its arm names (:mod:`smcr.rdma.shm.cq`); or, for a
    SEND keyed ``wake`` while the CQ is armed for no application thread, the consumer
    bell armed for that key (:mod:`smcr.rdma.bells`)."""
    notify = peer.notify
    if notify is not None:  # ring only a CQ armed for sleep (smcr.rdma.shm.cq)
        mark = peer.mark
        if mark:  # after produced: its poll looks at this QP
            notify[mark] = 1
        fence()
        target = _U32_UNPACK(notify, 0)[0]
        if not target:
            return
        if (wake and target != ARM_SLEEPER and peer.bells
                and ring_consumer(notify, peer.bells, wake)):  # fmt: skip
            return
        _U32_PACK(notify, 0, 0)
        if target == ARM_STANDBY and peer.standby_bell is not None:
            ring(peer.standby_bell)
            return
    ring(peer.bell)


def ring(bell: socket.socket) -> None:
    """Ring a peer's doorbell: a full one means rung already; a closed one, a dead peer."""
    try:
        bell.send(b"\x01", socket.MSG_NOSIGNAL)
    except OSError:
        pass
