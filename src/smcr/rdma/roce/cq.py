"""The completion queue of the RoCEv2 RNIC: whoever waits on it does the RNIC's receive work.

(On by default; ``SMCR_ROCE_POLLER_RX=0`` turns it off, and the progress thread
alone receives: :func:`poller_receives`.)

Design (the why of each):

* **No thread hop per message.**  With the device's progress thread reading the
  QP sockets, every message cost two wakeups: the progress thread (socket
  readable), then the application thread (CQ doorbell), and a GIL hand-off
  between them.  Measured between two namespaces on the 2-core reference host,
  a plain Python UDP ping-pong takes about 7 µs per round trip when the
  reading thread is the one that waits and about 70 µs with one thread hop per
  direction.  So the thread that polls this CQ receives itself: a progress hook
  (:meth:`CompletionQueue.add_progress`) reads the readable sockets of the QPs
  attached to the CQ, non-blocking, and runs their packets through the QP
  before the queue is looked at.
* **The descriptor covers the sockets.**  :meth:`fileno` is an ``epoll``
  descriptor holding the doorbell and the flow socket of every attached QP, so
  a thread that sleeps on the CQ (``select``/``poll``/asyncio, or
  :meth:`wait`) wakes when a packet arrives, not only when a completion is
  pushed.  The hook asks the same epoll (timeout 0) which sockets are
  readable, and whether the doorbell rang: one system call per poll, however
  many QPs.  The hook drains the doorbell itself, so a caller that cannot
  ``read`` the descriptor (reading an epoll descriptor fails; callers ignore
  that) never finds it readable for good.
* **The progress thread steps back while someone waits here** (see
  :meth:`RoceDevice._on_qp_socket`): when it finds a socket whose CQs a waiter
  looked at within :data:`CEDE_SECONDS` (:meth:`RoceCq.waiting`: a thread asleep
  on the CQ or watching it, which the socket's packets wake), it stops watching
  that socket and looks again that much later, so a busy CQ costs one wakeup per
  packet batch, in the thread that wants the completion.  A look by a program that
  waits in ``select`` on its connections' readiness descriptors (an event loop)
  does not count: it sleeps there, not on the CQ; the runtime's own progress thread
  sleeps on the CQ for it (:meth:`Progress._standing_by
  <smcr.stack.progress.Progress._standing_by>`) and receives the answers that it then
  makes ready, one thread hop per message rather than two.  Nobody polling (a WRITE target
  that never looks at its CQ) means the progress thread keeps the socket, and a ceded
  socket found holding packets is taken back (the poller went away): a packet
  waits for the application at most about :data:`CEDE_SECONDS`, far below any
  retransmit timeout the peer would use with SMC-R (Linux: ``timeout`` 14 or
  more, 67 ms).
* **Measured** (``bench/roce_bench.py``, veth between namespaces, 2 cores):
  a 44-byte SEND ping-pong went from about 420 µs to about 150-200 µs per
  round trip on an idle host; what is left is CPU, about 130 µs of Python per
  round trip (two SENDs, two ACKs), not wakeups.
* **Completions made inside the hook do not ring** this CQ: the poll that runs
  the hook returns them (the shm RNIC's rule, ``push_many(notify=False)``).
"""

from __future__ import annotations

import logging
import os
import select
import socket
from typing import Final, Protocol

from smcr.bound import monotonic
from smcr.rdma.completion import EpollCq


class ReceivingQp(Protocol):
    """A QP whose flow socket a CQ's poller reads (:class:`~smcr.rdma.roce.qp.ReceivingQp`): the
    QP module needs the CQ, and an import back from here would close a circle."""

    @property
    def rx_sock(self) -> socket.socket | None:
        """The QP's flow socket (None before RTR and after destroy)."""

    def receive(self) -> None:
        """Read and handle what waits on the flow socket (its device's receive)."""

log = logging.getLogger(__name__)

POLLER_RX_ENV: Final = "SMCR_ROCE_POLLER_RX"


def poller_receives() -> bool:
    """Whether CQ pollers receive (default; ``SMCR_ROCE_POLLER_RX=0`` says no), read when a
    CQ is made.

    Why on: SMC-R over RoCE between two namespaces measured 0.41-0.43x TCP with it
    and 0.23x without (the progress thread and the application then trade the GIL
    per packet batch).  History: session 2 kept it off because SMC-R's 1 GiB
    both-directions test failed in about one run of three with it (a reader
    waiting for bytes, then "TEST LINK not answered").  Most likely that was a peer
    process exiting right after ``close`` with packets still unsent (the same
    symptom was traced to it in another test; the faster path makes it likelier);
    ``close`` now waits for the peer to confirm the closing CDC
    (:func:`smcr.stack.conn.cdcs_done`), and 20 runs of both bulk tests passed since.
    The switch stays for diagnosis.
    """
    return os.environ.get(POLLER_RX_ENV, "1") != "0"


#: How long after a poll of its CQ a QP socket is left to the poller.
CEDE_SECONDS: Final = 0.004


class RoceCq(EpollCq):
    """A completion queue whose pollers receive the packets of its QPs (the flow sockets in
    its epoll descriptor)."""

    def __init__(self, depth: int) -> None:
        super().__init__(depth)
        self._attached: dict[int, ReceivingQp] = {}
        self.last_poll = 0.0
        self.pollers_receive = poller_receives()
        self.add_progress(self._receive)

    def attach(self, qp: ReceivingQp, fd: int) -> None:
        """Receive the flow socket ``fd`` of ``qp`` in this CQ's pollers too."""
        if not self.pollers_receive:
            return
        try:
            self._ep.register(fd, select.EPOLLIN)
            self._attached[fd] = qp
        except (OSError, ValueError):
            pass

    def receives(self, qp: ReceivingQp) -> bool:
        """Whether this CQ's pollers receive for ``qp``."""
        return qp.rx_sock is not None and self._attached.get(qp.rx_sock.fileno()) is qp

    def detach(self, fd: int) -> None:
        """Stop looking at ``fd`` (before it is closed)."""
        if self._attached.pop(fd, None) is not None:
            try:
                self._ep.unregister(fd)
            except (OSError, ValueError):
                pass

    def waiting(self) -> None:
        """A thread that waits on this CQ looks now: the progress thread leaves the QPs'
        sockets to it for :data:`CEDE_SECONDS` (:meth:`RoceDevice._on_qp_socket
        <smcr.rdma.roce.device.RoceDevice._on_qp_socket>`).  Only a waiter says so: a
        thread asleep on the CQ or watching it, or a look by a program that waits only in
        its own calls, whose next call comes back here (:meth:`Executor._process
        <smcr.stack.executor.Executor._process>`).  A program that waits in ``select``
        on its connections' readiness descriptors (an event loop) sleeps elsewhere
        between its calls: ceded to its looks, the packets that answer it waited for
        nobody until the socket was taken back (up to :data:`CEDE_SECONDS` a message)."""
        self.last_poll = monotonic()

    def _receive(self) -> None:
        """The progress hook: receive on the readable QP sockets (the doorbell drained if
        rung: :meth:`EpollCq.ready_now`)."""
        ready = self.ready_now()
        if ready is None:
            return  # closed
        attached = self._attached
        for fd in ready:
            qp = attached.get(fd)
            if qp is not None:
                try:
                    qp.receive()
                except Exception:  # as in the progress thread: a provider fault is logged,
                    log.exception("RoCE receive in a CQ poller failed")  # not the app's

    def close(self) -> None:
        """Release the descriptors; later use raises ``OSError``."""
        self._attached.clear()
        super().close()
