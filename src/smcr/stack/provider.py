"""What the engine asks of the runtime synchronously (:class:`~smcr.core.events.Provider`):
QPs, RMBs (placed in their link group, registered on other RNICs), and the host's routes.

Apart from the executor, which runs the engine's actions, because the questions need only
the ports, the QPs and the buffer pool, not the data path.
"""

from __future__ import annotations

from smcr.core import NextHop, Rmb
from smcr.stack import ports, routes
from smcr.stack.bufpool import BufferPool
from smcr.stack.devices import IP_RNICS
from smcr.stack.hostconn import HostConn, PortRes
from smcr.stack.qps import QueuePairs


class EngineHost:
    """The runtime as the engine's provider.

    :param conns: the executor's connections (:attr:`Executor.conns`), and ``retired``
        those whose RMB the peer may still write (the same dicts, not copies)."""

    def __init__(self, ports_: list[PortRes], qp: QueuePairs, pool: BufferPool,
                 conns: dict[int, HostConn], retired: dict[int, HostConn]) -> None:  # fmt: skip
        self.ports = ports_
        self.qp = qp
        self.pool = pool
        self.conns = conns
        self.retired = retired

    def new_qp(self, port: int = 0) -> tuple[int, int]:
        """A QP in RESET on ``port``'s RNIC (:meth:`QueuePairs.new_qp`)."""
        return self.qp.new_qp(port)

    def register_rmb(self, conn: int, port: int) -> tuple[int, int]:
        """The connection's RMB registered on ``port``'s RNIC too (a link over it joined the
        group; :meth:`BufferPool.alias`)."""
        hc = self.conns.get(conn) or self.retired.get(conn)
        if hc is None:
            raise ValueError(f"connection {conn}: no buffers to register on port {port}")
        return self.pool.alias(hc, port, self.ports[port].pd)

    def place_rmb(self, conn: int, lgr_id: int, size: int) -> Rmb | None:
        """The connection's RMB (:meth:`BufferPool.place`): on shm placed in the link group
        the engine chose for it, on RoCE the one taken when the handshake started; None:
        no memory for it."""
        hc = self.conns.get(conn)
        mr = None if hc is None else self.pool.place(hc, lgr_id, size)
        return None if mr is None else Rmb(mr.rkey, mr.addr, mr.length)

    def reaches(self, port: int, gid: bytes) -> bool:
        """Whether our ``port`` has a path to a peer port's GID (RoCE: the kernel's route,
        :func:`ports.roce_reaches`; shm: always)."""
        dev = self.ports[port].device
        return not isinstance(dev, IP_RNICS) or ports.roce_reaches(dev, gid)

    def find_route(self, port: int, gid: bytes) -> NextHop | None:
        """How our ``port`` reaches a peer's GID (RoCE: the kernel's route,
        :func:`routes.find_route`, Linux ``smc_ib_find_route``; None: no route; shm: every
        peer on-link)."""
        dev = self.ports[port].device
        if not isinstance(dev, IP_RNICS):
            return NextHop()
        route = routes.find_route(routes.gid_address(gid), routes.gid_address(dev.gid))
        return None if route is None else NextHop(route.uses_gateway, route.nexthop_mac)
