"""The runtime's records: one SMC connection (:class:`HostConn`), one RNIC (:class:`PortRes`),
and what may watch a runtime's link traffic (:class:`StackTap`).

They sit below every part of the runtime (:mod:`smcr.stack.runtime` lists them), which all
read and write them under the runtime's one lock.
"""

from __future__ import annotations

import socket
import threading
from _thread import LockType
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smcr._mypyc import mypyc_attr
from smcr.core import Action
from smcr.core.handshake import Handshake
from smcr.rdma.base import Device, MemoryRegion, ProtectionDomain
from smcr.stack.readiness import Readiness


@dataclass(eq=False, init=False)
class HostConn:
    """The runtime's side of one SMC connection: TCP socket, buffers, waiters.  Made per
    connection: ``__init__`` written out (:class:`smcr.core.events.SendClc`)."""

    conn_id: int
    tcp: socket.socket
    cond: threading.Condition | None
    """Where threads that wait for news of the connection sleep while another polls, made
    by the first of them (:meth:`waitable`): most connections never have one, and a
    ``Condition`` costs a microsecond of interpreted code to make."""
    rmb_mr: MemoryRegion | None = None
    rmb_group: int = -1
    """The link group the RMB belongs to (:meth:`BufferPool.place
    <smcr.stack.bufpool.BufferPool.place>`)."""
    sndbuf_mr: MemoryRegion | None = None
    peer: Any = None  # (Any, not object: mypyc)
    """(client?, peer's address) of the connection, for the pool's choice of a RoCE RMB
    (:meth:`BufferPool.reserve <smcr.stack.bufpool.BufferPool.reserve>`)."""
    handshake: Handshake | None = None
    outcome: Any = None  # (Any, not object: mypyc) HandshakeCompleted / FellBack / HandshakeFailed
    reset_reason: str = ""
    tcp_error: int = 0
    """The TCP socket's error (``ECONNRESET``) that a CLC read took from the kernel, which
    tells it once: the application's socket reports it instead (a server's handshake
    whose client reset its TCP, :func:`smcr.socket.handshake.finish_handshake`)."""
    readiness: Readiness | None = None
    waiters: int = 0  # threads in cond.wait: notify only when someone listens (1.5 µs)
    released: bool = False
    on_release: list[Callable[[], None]] = field(default_factory=list)
    # called (lock held) once the handshake has an outcome: accept queues and
    # non-blocking connects finish the socket there, whichever thread polled
    on_outcome: Callable[[HostConn], None] | None = None
    local_peer: bool | None = None  # the other end is in this runtime (Executor.local_peer)
    ends: tuple[object, object] | None = None  # handshaking: (ours, peer's) TCP addresses
    trim_seen: int = -1
    """Our producer cursor at the last idle look (:mod:`smcr.stack.trim`)."""
    trim_prod: int = 0
    """The peer's producer cursor at the last idle look."""
    trim_cons: int = 0
    """The peer's consumer cursor at the last give-back: its RMB is given back behind it."""
    trim_sent: int = 0
    """Our send buffer is given back behind this (absolute byte count)."""
    aliases: dict[int, tuple[MemoryRegion, MemoryRegion]] = field(default_factory=dict)
    """Port -> (RMB, send buffer) registered on that port's RNIC too
    (:meth:`BufferPool.alias <smcr.stack.bufpool.BufferPool.alias>`; port 0's are
    :attr:`rmb_mr` and :attr:`sndbuf_mr`)."""

    def __init__(self, conn_id: int, tcp: socket.socket, cond: threading.Condition | None,
                 rmb_mr: MemoryRegion | None = None, rmb_group: int = -1,
                 sndbuf_mr: MemoryRegion | None = None, peer: Any = None,
                 handshake: Handshake | None = None, outcome: Any = None,
                 reset_reason: str = "", tcp_error: int = 0, readiness: Readiness | None = None,
                 waiters: int = 0, released: bool = False,
                 on_release: list[Callable[[], None]] | None = None,
                 on_outcome: Callable[[HostConn], None] | None = None,
                 local_peer: bool | None = None, ends: tuple[object, object] | None = None,
                 trim_seen: int = -1, trim_prod: int = 0, trim_cons: int = 0, trim_sent: int = 0,
                 aliases: dict[int, tuple[MemoryRegion, MemoryRegion]] | None = None,
                 ) -> None:  # fmt: skip
        self.conn_id = conn_id
        self.tcp = tcp
        self.cond = cond
        self.rmb_mr = rmb_mr
        self.rmb_group = rmb_group
        self.sndbuf_mr = sndbuf_mr
        self.peer = peer
        self.handshake = handshake
        self.outcome = outcome
        self.reset_reason = reset_reason
        self.tcp_error = tcp_error
        self.readiness = readiness
        self.waiters = waiters
        self.released = released
        self.on_release = [] if on_release is None else on_release
        self.on_outcome = on_outcome
        self.local_peer = local_peer
        self.ends = ends
        self.trim_seen = trim_seen
        self.trim_prod = trim_prod
        self.trim_cons = trim_cons
        self.trim_sent = trim_sent
        self.aliases = {} if aliases is None else aliases

    def waitable(self, lock: LockType) -> threading.Condition:
        """:attr:`cond`, made now on ``lock`` (the runtime's) if it has not been (lock held)."""
        cond = self.cond
        if cond is None:
            cond = self.cond = threading.Condition(lock)
        return cond

    def undecided(self) -> bool:
        """The handshake has no outcome yet.  A method: after ``if hc.outcome is None``
        mypyc reads ``hc.outcome`` as None-typed in that branch, and a call that
        settled it meanwhile makes the read a TypeError."""
        return self.outcome is None

    def trailing_data(self) -> bytes:
        """Bytes the peer sent behind its last CLC message: the application's, after a
        fallback (h11's ``trailing_data``)."""
        return self.handshake.reader.trailing_data if self.handshake is not None else b""

    @property
    def rmb(self) -> memoryview:
        """Our RMBE."""
        assert self.rmb_mr is not None
        return self.rmb_mr.buf

    @property
    def sndbuf(self) -> memoryview:
        """Our send buffer."""
        assert self.sndbuf_mr is not None
        return self.sndbuf_mr.buf


@dataclass(eq=False)
class PortRes:
    """One RNIC of a runtime (a port of its engine's identity) and what is registered on it.

    Why one CQ for every port's QPs: the software RNICs' CQs are process objects any
    of their QPs may complete into, and one CQ keeps the poll loop, the sleep and the
    spin of the data path as they are with one RNIC (one descriptor to sleep on).
    The receive and send slots are one buffer each, registered on every RNIC: a slot
    index means the same bytes whichever port's QP used it.
    """

    device: Device
    pd: ProtectionDomain
    recv_mr: MemoryRegion
    send_mr: MemoryRegion
    up: bool = True
    """False from ``Stack.port_down`` to ``Stack.port_up``."""


@mypyc_attr(allow_interpreted_subclasses=True)
class StackTap:
    """Something that watches one runtime's link traffic (``smcr trace``, tests): subclass
    it, override what you watch, set it as ``Stack.tap``.

    Why a tap and not methods shadowed per instance: the runtime's classes are native
    in the compiled build, whose compiled callers would never see a shadow; the
    runtime tests ``tap is None`` where it would call one, nothing more.  Called
    with the runtime's lock held, in whichever thread does the work: keep it short,
    never block, never call the runtime back.  ``stack`` is the runtime
    (:class:`~smcr.stack.runtime.Stack`).
    """

    def new_qp(self, stack: Any, qpn: int) -> None:
        """The runtime made QP ``qpn`` (it is in ``stack.qps``)."""

    def received(self, stack: Any, qpn: int, messages: list[memoryview]) -> None:
        """SENDs that arrived on QP ``qpn``, before the engine gets them."""

    def control(self, stack: Any, action: Action) -> None:
        """An engine action other than a post, before the runtime carries it out
        (:class:`~smcr.core.events.SendClc`: a CLC message about to go)."""

    def receive_clc(self, stack: Any, conn: int, data: bytes) -> None:
        """CLC bytes read from connection ``conn``'s TCP socket, before the engine gets them."""


@dataclass(eq=False)
class Taps:
    """Where a runtime's tap is (one object every part of the runtime holds): the tap, and
    the runtime it is told about."""

    tap: StackTap | None = None
    host: Any = None
