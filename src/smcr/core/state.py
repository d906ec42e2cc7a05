"""The state every part of the engine works on: one object, shared (STYLE §2).

The engine is composed of parts, each with one concern: the link layer and LLC
(:mod:`smcr.core.llc`), ADD LINK (:mod:`smcr.core.addlink`), failover
(:mod:`smcr.core.failover`), the host's ports (:mod:`smcr.core.ports`), the rkeys of
our RMBs (:mod:`smcr.core.rkeys`) and the CLC handshakes (:mod:`smcr.core.clc`).  None
of them owns the connections, link groups and links they all work on: those are here,
with what the host gave (config, identity, provider) and what the engine reports
(events).  :class:`~smcr.core.engine.Engine` makes one and hands it to every part;
its public attributes (``engine.conns``, ``engine.lgrs``...) are this object's.

The few methods are the bookkeeping several parts do the same way: forgetting a
connection from every index, a handshake ending in a fallback.
"""

from __future__ import annotations

from collections import deque

from smcr.core.config import Config, LocalIdentity
from smcr.core.connection import Connection
from smcr.core.events import Event, FellBack, Provider
from smcr.core.handshake import Handshake, HsState
from smcr.core.linkgroup import Link, LinkGroup


class EngineState:
    """The engine's data (module docstring); the host serialises every call."""

    def __init__(self, config: Config, identity: LocalIdentity, provider: Provider) -> None:
        self.config = config
        self.identity = identity
        self.provider = provider
        self.ueids: tuple[bytes, ...] = ()
        """The host's user EIDs (:mod:`smcr.ueid`), kept current by the host: a
        Proposal offers SMC-Rv2 only with one, a server chooses v2 only on a common one."""
        self.conns: dict[int, Connection] = {}
        self.handshakes: dict[int, Handshake] = {}
        self.lgrs: dict[int, LinkGroup] = {}
        self.links: dict[int, Link] = {}
        """Every link by the QP number of its QP (a SEND or completion names the QP)."""
        self.late_links: dict[int, Link] = {}
        """Links cleared while their group lives, by QPN: CDCs they delivered may still be
        in the host's CQ (:meth:`LinkLayer._receive_late
        <smcr.core.llc.LinkLayer._receive_late>`)."""
        self.cdc_pending: dict[int, deque[tuple[int, Connection, int]]] = {}
        """Per link (QPN): the CDCs whose send completion frees send-buffer space,
        as (wr id, connection, its tx cursor then)."""
        self.events: deque[Event] = deque()
        self.dropped = 0
        """LLC and CDC messages dropped (each also an :class:`~smcr.core.events.LlcDropped`)."""
        self.touched: set[int] = set()
        """Connections whose cursors or state changed since the host last cleared it."""
        self.unconfirmed: set[int] = set()
        """Handshakes whose RMB's CONFIRM RKEY failed before they ended
        (:meth:`Rkeys.confirm_rkey <smcr.core.rkeys.Rkeys.confirm_rkey>`)."""
        self.ending: set[int] = set()
        """Link groups :meth:`Engine.shutdown <smcr.core.engine.Engine.shutdown>` sent
        DELETE LINK on, waiting for the peer's."""
        self.ports_down: set[int] = set()
        """Ports of :attr:`LocalIdentity.ports` the host reported unusable
        (:meth:`Ports.port_down <smcr.core.ports.Ports.port_down>`), until ``port_up``:
        no new link goes over them."""

    def forget_conn(self, conn_id: int) -> None:
        """A connection whose handshake did not end in SMC-R: out of every index."""
        self.unconfirmed.discard(conn_id)
        conn = self.conns.pop(conn_id, None)
        if conn is not None:
            for lgr in self.lgrs.values():
                lgr.conns.pop(conn.token, None)

    def fall_back(self, hs: Handshake, local: int, peer: int) -> None:
        """The handshake ends in a fallback to TCP, with these reason codes (0 when none)."""
        self.handshakes.pop(hs.conn, None)
        hs.state = HsState.FALLBACK
        self.forget_conn(hs.conn)
        self.events.append(FellBack(conn=hs.conn, local_code=local, peer_code=peer))
