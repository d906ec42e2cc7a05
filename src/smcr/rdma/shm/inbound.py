"""The responder's side of a shm QP's connection: who may hold its receive area.

A device's rendezvous is open to every user of the network namespace (its
abstract name, :mod:`smcr.rdma.shm.rendezvous`), so a hello is taken only from
the QP's peer.  Once the QP is at RTR its destination is known: the QP and
device it connected to (QPN, GID) and, by ``SO_PEERCRED`` on that connection,
the process behind them; a hello must match all three (the GID a requester
claims is thereby proven: its connection comes from the process that listens
on that GID).  Before RTR (the peer may reach RTR first, as a client does at
CLC Accept) the first hello is taken and no other; the QP's RTR then checks it
the same way and fails if it is not from the destination, so a QP whose area a
stranger mapped is never used.

Design: one small lock, the only one the device's server thread takes here,
guards the inbound socket and the destination together, so a hello and an RTR
at the same moment see each other (whichever comes second does the check).
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable

from smcr.rdma.eventloop import Engine
from smcr.rdma.shm import rendezvous as rdv
from smcr.rdma.verbs import VerbsError

Identity = tuple[int, bytes, tuple[int, int, int]]
"""A QP at the other end: its QPN, its device's GID, the (pid, uid, gid) of its process."""


class Inbound:
    """The requester connected to this QP's area, and the destination it must be.

    :param engine: the device's event loop (watches the inbound socket).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sock: socket.socket | None = None
        self._source: Identity | None = None
        self._dest: Identity | None = None
        self._lock = threading.Lock()

    def admit(self, sock: socket.socket, claimed: tuple[int, bytes], token: bytes,
              fds: list[int], on_event: Callable[[int], None],
              mark: int = 0) -> bool:  # fmt: skip
        """Server thread: take a hello claiming to be QP ``claimed`` (QPN, GID) if it may
        be our peer (module docstring), answering it with ``token``, our ``fds`` and the
        offset of the QP's ``mark`` byte (:mod:`smcr.rdma.shm.cq`).

        :returns: whether it was taken (else refused with EPERM).
        """
        source = (*claimed, rdv.credentials(sock))
        with self._lock:
            if source != self._dest if self._dest is not None else self.sock is not None:
                rdv.send(sock, rdv.Message(rdv.NACK, a=errno.EPERM))
                return False
            rdv.send(sock, rdv.Message(rdv.HELLO_OK, a=mark, gid=token), fds)
            sock.setblocking(False)
            old, self.sock, self._source = self.sock, sock, source
            self.engine.watch(sock.fileno(), on_event)
            if old is not None:
                self.engine.unwatch(old.fileno())
                old.close()
        return True

    def bind(self, dest: Identity | None) -> None:
        """At RTR, the destination (``None`` when the QP leaves it).

        :raises VerbsError: EPERM when a hello already taken is not from ``dest``.
        """
        with self._lock:
            if dest is not None and self.sock is not None and self._source != dest:
                raise VerbsError(errno.EPERM, "the QP's inbound connection is not from its "
                                 "destination QP")  # fmt: skip
            self._dest = dest

    def drop(self) -> None:
        """Close the inbound connection (the requester sees EOF: we are gone or reset)."""
        with self._lock:
            if self.sock is not None:
                self.engine.unwatch(self.sock.fileno())
                self.sock.close()
                self.sock = self._source = None
