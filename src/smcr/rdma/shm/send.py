"""The tail of a requester's SEND on the shm RNIC: the placement of the data path's
fused batch in C where it is built (``_place.c``), the peer CQ's mark and arm words, and
the doorbells or consumer bell rung (:mod:`smcr.rdma.shm.cq`, :mod:`smcr.rdma.bells`).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from types import ModuleType

from smcr.rdma import doorbell
from smcr.rdma.base import QueuePair
from smcr.rdma.bells import WATCH_MASK, WATCHES, ring_consumer, ring_name
from smcr.rdma.completion import ARM_SLEEPER, ARM_STANDBY, TAKEN_IN_PLACE, CompletionQueue
from smcr.rdma.shm.peer import PeerLink, RemoteMr
from smcr.rdma.shm.words import C_WORDS, fence, load_u32, store_u32
from smcr.rdma.verbs import QpAttr, QpState, WcOpcode, WcStatus, WorkCompletion

#: The C of the fused send (``_place.c``, :data:`smcr.rdma.shm.words.C_WORDS`: built with the
#: compiled modules, None in a pure-Python process); tests set it to None to run the Python
#: in a compiled process.
PLACE: ModuleType | None = C_WORDS


def c_poster(qp_class: type) -> object | None:
    """``_place.c``'s ``post_inline`` for C callers (the stack's fast lane): a capsule, once
    the C is bound to the compiled classes whose objects it reads (``qp_class``: the
    :class:`~smcr.rdma.shm.qp.ShmQp` class, which imports this module); None without the
    C, or where the classes are not the compiled ones (an interpreted ``qp_class``)."""
    place = PLACE
    if place is None:
        return None
    try:
        place.bind(qp_class, PeerLink, RemoteMr, QpAttr, QpState.RTS, WATCHES, WATCH_MASK,
                   sent_signaled)  # fmt: skip
    except TypeError:
        return None
    capsule: object = place.POST_INLINE
    return capsule


def c_drainer() -> Callable[[QueuePair], int] | None:
    """``_place.c``'s ``drain_in_place`` (:data:`smcr.rdma.shm.qp.DRAIN_IN_PLACE`), once
    :func:`c_poster` bound the C to the compiled classes; None without it."""
    place = PLACE
    if place is None:
        return None
    try:
        place.bind_drain(CompletionQueue, TAKEN_IN_PLACE, WorkCompletion)
    except TypeError:
        return None
    drain: Callable[[QueuePair], int] = place.drain_in_place
    return drain


def c_looks() -> tuple[Callable[[QueuePair], None], Callable[[QueuePair], bool]] | None:
    """``_place.c``'s ``drain_hook`` and ``sends_waiting``: a shm CQ's look at a QP in C (the
    run and the peek of :meth:`ShmCompletionQueue.set_peek
    <smcr.rdma.shm.cq.ShmCompletionQueue.set_peek>`, bound to one exact
    :class:`~smcr.rdma.shm.qp.ShmQp`), once :func:`c_drainer` bound the C; None without it."""
    place = PLACE
    if place is None:
        return None
    return place.drain_hook, place.sends_waiting


def sent_signaled(qp: QueuePair, wr_id: int, size: int) -> None:
    """A signaled SEND of ``size`` bytes placed (state lock held): its completion, on the
    requester's side at once, as every shm SEND completes once it is in the peer's slot."""
    qp.send_cq.push(WorkCompletion(wr_id=wr_id, status=WcStatus.SUCCESS, opcode=WcOpcode.SEND,
                                   qp_num=qp.qp_num, byte_len=size), local=True)  # fmt: skip


def notify(peer: PeerLink, wake: int = 0) -> None:
    """After a SEND was placed (``produced`` stored): mark the peer QP, and ring the peer's CQ
    if it is armed, with the doorbell its arm names (:mod:`smcr.rdma.shm.cq`); or, for a
    SEND keyed ``wake`` while the CQ is armed for no application thread, the consumer
    bell armed for that key (:mod:`smcr.rdma.bells`)."""
    notify = peer.notify
    if notify is not None and PLACE is not None:  # (the same, by _place.c's look_peer)
        ring_whom(peer, PLACE.look_peer(notify, peer.mark, wake, WATCHES, WATCH_MASK,
                                        peer.bells))  # fmt: skip
        return
    if notify is not None:  # ring only a CQ armed for sleep (smcr.rdma.shm.cq)
        mark = peer.mark
        if mark:  # after produced: its poll looks at this QP
            notify[mark] = 1
        fence()
        target = load_u32(notify, 0)
        if not target:
            return
        if (wake and target != ARM_SLEEPER and peer.bells
                and ring_consumer(notify, peer.bells, wake)):  # fmt: skip
            return
        # (Python has no atomic exchange: between the load and this store the consumer may
        # have armed for another door, and a ring of the door read would wake nobody.  A
        # standby's arm read is rung at both doors: a poller that took it back and armed
        # its own sleeps on the CQ's (a spurious wake-up at worst).  A poller's arm read
        # rings its door alone: the standby armed over it looked once after arming, and
        # later news waits for the progress thread's look-in at worst; ringing the standby
        # at every message woke the progress thread at every round trip.  The C takes the
        # word by a compare and exchange, and rings the door of the value it took.)
        store_u32(notify, 0, 0)
        if target == ARM_STANDBY and peer.standby_bell is not None:
            ring(peer.standby_bell)
    ring(peer.bell)


def ring_whom(peer: PeerLink, whom: int) -> None:
    """Ring whom ``_place.c``'s look at the peer CQ's words named (``look_peer``, and the
    lane's ``post_inline``): nobody (0), the CQ's doorbell (1) or its standby doorbell (2),
    or a consumer bell (``rid << 2 | door``: the doorbell ``door`` if it cannot be rung; the
    arm word is left as it is then, since a plain store of 0 could erase an arm the consumer
    made since for another door: a ring beside an arm costs a spurious wake-up at most)."""
    if not whom:
        return
    if whom > 3 and ring_name(peer.bells, whom >> 2):
        return
    if whom & 3 == ARM_STANDBY and peer.standby_bell is not None:
        ring(peer.standby_bell)
        return
    ring(peer.bell)


def ring(bell: socket.socket) -> None:
    """Ring a peer's doorbell: a full one means rung already; a closed one, a dead peer."""
    doorbell.ring(bell)
