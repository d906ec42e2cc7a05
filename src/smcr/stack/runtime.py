"""The runtime: one engine, one RNIC and one progress thread per RNIC in use.

Design (the why of each):

* **The RNIC is chosen per connection** (:func:`get_stack`,
  :mod:`smcr.stack.devices`): the shm RNIC (one per process, the default), or
  with ``SMCR_RNIC=roce`` the RoCE RNIC of the TCP connection's local address.
  Everything above the verbs is the same for both.
* **Further RNICs are ports of the same engine** (``more_devices``,
  :mod:`smcr.stack.ports`): a link group then has a link over each (ADD LINK), every
  RMB registered on each (:meth:`Stack.register_rmb`), one CQ for all their QPs
  (:class:`PortRes`).  An RNIC that fails (:meth:`Stack.port_down`: its net device,
  or an injected failure) has its links failed over by the engine; when it is back
  (:meth:`Stack.port_up`) a link is added again.

* **One lock serialises the engine** (STYLE §9): application threads and the
  progress thread call the engine only while holding :attr:`Stack.lock`.
* **Progress does not depend on the application.**  A daemon thread answers
  TEST LINK, CONFIRM/DELETE RKEY, and takes CDCs (window updates, close
  flags) while the application computes.  It sleeps in ``select`` on the CQ's
  descriptor and on the engine's next deadline: it never spins.
* **Whoever waits, polls.**  A thread blocked in ``recv``/``send`` does not
  wait for the progress thread to hand it the news (two wakeups per message,
  one of them a thread hop under the GIL); it becomes the *poller* itself and
  sleeps on the CQ descriptor, so a message costs one wakeup, as in TCP.  A
  thread blocked in ``accept`` polls the same way (:meth:`Stack.poll_until`): it
  reads the handshakes' CLC messages itself, whose TCP sockets pollers sleep on
  through one epoll descriptor (a new one needs no doorbell).  One
  application thread at a time holds the poller role; others wait on their
  connection's condition, which the poller notifies; the progress thread
  steps back while an application thread polls.  Before it arms the CQ and
  sleeps, a waiter watches it for :data:`SPIN` (yielding the CPU between
  looks): an answer that comes within microseconds then costs no doorbell, no
  sleep and no wakeup on either side.
* **The data path is fused where the RNIC allows** (shm: inline WRs): a send
  with nothing waiting goes from the caller's buffer straight into the peer's
  RMBE with its CDC in one call (:meth:`Stack.send_inline`), flushes from the
  send buffer and CDCs go the same way (``QueuePair.post_writes_send``), and
  receives are reposted in batches (:data:`REPOST_BATCH`).  What is left per
  message is Python work; ``smcr bench`` shows its CPU time per message.
* **Buffers are pooled** (Linux keeps freed RMBs in the link group for reuse):
  a released connection's RMB and send buffer go back to a per-size free list
  and come out again with the same rkey and address.  They go back when the
  engine says the peer can no longer write into the RMB (:class:`~smcr.core.ReuseRmb`,
  Linux ``smcr_buf_unuse``): at once after an orderly close, where the group keeps
  the RMB announced and its next connection that gets it needs no CONFIRM RKEY
  (:meth:`Engine.release <smcr.core.engine.Engine.release>`); otherwise once the
  peer has answered the DELETE RKEY of the RMB: a write it posted before arrives
  before that answer, never in the next connection's bytes.  The pool is bounded
  by :attr:`Stack.max_buffers`; past it the handshake declines with ``MEM``
  (which is also how the tests make a server decline).
* **Readiness descriptors**: ``fileno()`` of an SMC socket is one end of a
  unix socket pair made readable (a byte is waiting) and writable (the other
  end drained) to follow the connection; see :class:`Readiness`.
* **Orphans**: a socket collected unclosed hands its connection over without
  the lock (:meth:`Stack.orphan`); the progress thread drains its send buffer
  and closes it, as the kernel finishes a closed socket's work.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import ipaddress
import os
import secrets
import select
import socket
import struct
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from smcr import settings
from smcr._mypyc import mypyc_attr
from smcr.core import (
    Action,
    Config,
    ConnectionReset,
    DestroyQp,
    Engine,
    FellBack,
    HandshakeCompleted,
    HandshakeFailed,
    LocalIdentity,
    Port,
    PostSend,
    QpToRtr,
    QpToRts,
    RdmaWrite,
    ReleaseConnection,
    ReuseRmb,
    Rmb,
    SendClc,
    ShutdownTcp,
)
from smcr.core.connection import Connection
from smcr.core.handshake import Handshake
from smcr.diag.counters import COUNTERS
from smcr.pnet import Entry, PnetTable, lookup
from smcr.rdma import (
    AccessFlag,
    MemoryRegion,
    PathMtu,
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    rc_bring_up,
)
from smcr.rdma.base import Device, ProtectionDomain, QueuePair
from smcr.rdma.roce import RoceDevice
from smcr.rdma.shm import ShmDevice, ShmPd
from smcr.stack import devices, ports
from smcr.stack.descriptors import put_at
from smcr.ueid import UeidTable
from smcr.wire.clc import make_hostname
from smcr.wire.decline import DeclineCode

_DEBUG = settings.debug()
RMB_ACCESS = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE
QP_ACCESS = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE
RECV_SLOTS = 256  # per QP; Linux posts 48 (we answer from one thread, so keep more)
_LINGER_ZERO = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
SLOT = 64  # receive buffer per slot: v1 LLC and CDC are 44 bytes (Linux: 48)
V2_MSG = 8192
"""The longest SMC-Rv2 LLC message a receive takes (Linux ``SMC_WR_BUF_V2_SIZE``): ADD LINK
v2 is 88 bytes and more (its rkey list), which a :data:`SLOT` alone would refuse with
LOC_LEN_ERR, ending the link.  As Linux's, each receive has a second SGE for the rest, in
one buffer per QP (Linux: per link group): LLC flows come one at a time."""
SEND_SLOTS = 4096
REPOST_BATCH = 16  # receives reposted together (RECV_SLOTS - REPOST_BATCH stay posted)
WAIT_FREE_SLOT = 10.0  # SMC_WR_TX_WAIT_FREE_SLOT_TIME
TIMER_GRAIN = 0.005  # how often process() asks the engine for its next deadline
STANDBY = 0.01  # the progress thread's look-in period while applications poll
SENDS_PER_PROCESS = 4
"""On RNICs without inline sends (RoCE), :meth:`Stack.send_fast` takes the news (ACKs, the
peer's cursors) every this many sends, or sooner when the send buffer runs short: one
look for several ACKs, which arrive one per message."""
TESTLINK_ENV = "SMCR_TESTLINK_TIME"
MAX_LINKS_ENV = "SMCR_MAX_LINKS"
EXIT_DELETE_WAIT = 1.0
"""At exit, how long the peers may take to answer our DELETE LINK with theirs."""
EXIT_LINGER = 2.0
"""At exit, how long closes under way may take before the links end (:meth:`Stack._end_links`;
``SMC_MAX_STREAM_WAIT_TIMEOUT``, the wait of a close for its data)."""
# Default send buffer and RMB on the shm RNIC, where Linux sizes them from the socket
# buffers (SO_SNDBUF/SO_RCVBUF still override it per socket): a window of 64 KiB
# costs a full consumer-cursor round trip per 64 KiB write; a larger one lets the
# sender run ahead of the reader.  4 MiB, as on RoCE: with 1 MiB a 1 MiB write
# filled the whole RMBE and waited for the reader (smcr bench, 4 alternating rounds:
# 256 KiB writes 1.07x -> 1.74x TCP, 1 MiB writes 1.16x -> 1.83x, CPU per write -38%).
# Pages of a memfd (shm) are only backed once written, so an idle connection costs
# little of it; a bulk one touches the whole ring in time.
BUFFER = 4 << 20
# The RoCE RNIC's default: 4 MiB, as far as Linux TCP's receive buffer autotunes
# (tcp_rmem max 4-6 MiB).  Why larger than shm's: the receiver confirms consumed bytes
# with a CDC every tenth of the RMBE (spec smc-r §4, Linux's rule), and over RoCE each
# such CDC costs a SEND, its ACK and a sender wake-up (~40 system calls per MiB with
# 1 MiB buffers, measured with strace); bulk SMC-R between two namespaces went from
# 0.40x to 0.56x TCP (smcr bench --bufsize, session 3).  The MRs are anonymous
# mappings, backed only where written (RocePd.alloc_mr).
ROCE_BUFFER = 4 << 20
AUTOCORK = 64 << 10
"""Autocorking size on the shm RNIC (Linux's ``autocorking_size`` default; see
:attr:`Config.autocork_size`): 1 KiB writes in a stream go as one CDC per batch."""
SPIN = settings.spin_seconds()
"""How long an application thread that waits polls the CQ before it arms it and sleeps."""


_DONTWAIT = socket.MSG_DONTWAIT


class Readiness:
    """A descriptor whose readability/writability the runtime sets (see module doc).

    Readable: one byte waits in ``a``.  Not writable: ``a`` has filled the other
    end's queue; writable again once ``b`` is drained.
    """

    def __init__(self) -> None:
        self.a, self.b = socket.socketpair()
        for s in (self.a, self.b):
            s.setblocking(False)
        self.a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024)
        self.readable = False
        self.writable = True
        st = os.fstat(self.a.fileno())
        self.file = (st.st_dev, st.st_ino)
        """(device, inode) of the descriptor's file: whether a number names it."""
        self.app = -1
        """The application's number for ``a``'s file (:meth:`fileno`), -1 before it asks."""

    def lost(self) -> bool:
        """Whether the application's descriptor was closed under us (``os.close`` of
        what ``fileno()`` gave) or now names another file: a socket's would-block path
        asks, so that its call fails with ``EBADF`` as one on the closed descriptor of
        a TCP socket does (one ``fstat``, only where the call would block anyway)."""
        return self.app >= 0 and not self._names_ours(self.app)

    def _names_ours(self, number: int) -> bool:
        try:
            st = os.fstat(number)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.file

    def set_blocking(self, blocking: bool) -> None:
        """Give the application's descriptor the socket's blocking mode (``O_NONBLOCK``),
        for programs that look at the flag of what ``fileno()`` returned; the runtime's
        own reads and writes of it never block either way."""
        with contextlib.suppress(OSError):
            os.set_blocking(self.a.fileno(), blocking)

    def fileno(self) -> int:
        """The application's descriptor: a number of its own for ``a``'s file, apart from
        the one the runtime reads and writes, so that a program that closes what it was
        given (``os.close(sock.fileno())``) never has the runtime write into whatever
        file takes that number next."""
        if self.app < 0:
            self.app = os.dup(self.a.fileno())
        return self.app

    def place(self, number: int) -> None:
        """Give the application this descriptor under ``number`` from now on (whatever it
        named before goes: :func:`smcr.stack.descriptors.put_at`)."""
        put_at(number, self.a.fileno())
        if self.app >= 0 and self.app != number:
            with contextlib.suppress(OSError):
                os.close(self.app)
        self.app = number

    def disown(self) -> None:
        """The application's number names another file now (the socket's TCP socket):
        :meth:`close` leaves it alone."""
        self.app = -1

    def set(self, readable: bool, writable: bool) -> None:
        """Make the descriptor's readiness match (syscalls only on a change).

        Writability first: a connect that settles turns writable before readable, so
        a program waiting for ``EPOLLOUT`` never sees ``EPOLLIN`` alone meanwhile (a
        loop that counts wakeups, or one that reads on ``EPOLLIN`` only, took such an
        in-between state for the socket's: the thread setting it may wait for the GIL
        while the program polls and spins)."""
        if writable != self.writable:
            self.writable = writable
            if writable:
                with contextlib.suppress(OSError):
                    while self.b.recv(65536, _DONTWAIT):
                        pass
            else:
                with contextlib.suppress(OSError):
                    while True:
                        self.a.send(bytes(4096), _DONTWAIT)
        if readable != self.readable:
            self.readable = readable
            if readable:
                with contextlib.suppress(OSError):
                    self.b.send(b"r", _DONTWAIT)
            else:
                with contextlib.suppress(OSError):
                    while self.a.recv(4096, _DONTWAIT):
                        pass

    def fail(self) -> None:
        """Ready for good, as a TCP socket whose connect failed: readable, writable, and
        ``EPOLLERR``/``EPOLLHUP`` in poll (a program waiting for either wakes as over TCP).

        How: ``b`` goes while it holds unread bytes of ``a``'s (the not-writable fill),
        and Linux then gives ``a`` the error ``ECONNRESET`` (``unix_release_sock``) and
        both shutdowns; ``b``'s queue freed makes ``a`` writable.  Later :meth:`set`
        calls change nothing (``b`` is closed: their sends and drains fail quietly)."""
        if self.writable:
            self.set(self.readable, False)  # (``b`` must hold unread bytes)
        with contextlib.suppress(OSError):
            self.b.close()  # (one change: all of a's events at once)
        self.readable = self.writable = True

    def close(self) -> None:
        """Release both ends (the application's end may have been closed under us by a
        program that closes the descriptors it was given)."""
        for end in (self.a, self.b):
            with contextlib.suppress(OSError):
                end.close()
        app, self.app = self.app, -1
        if app >= 0 and self._names_ours(app):  # (not a number closed and taken since)
            with contextlib.suppress(OSError):
                os.close(app)


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
    """False from :meth:`Stack.port_down` to :meth:`Stack.port_up`."""


def _alias(pd: ProtectionDomain, mr: MemoryRegion) -> MemoryRegion:
    """``mr``'s memory registered on another RNIC's PD, same access (shm: the same shared
    segment mapped again, :meth:`ShmPd.alias_mr`)."""
    if isinstance(pd, ShmPd):
        return pd.alias_mr(mr)
    return pd.reg_mr(mr.buf, mr.access)


@dataclass(eq=False)
class HostConn:
    """The runtime's side of one SMC connection: TCP socket, buffers, waiters."""

    conn_id: int
    tcp: socket.socket
    cond: threading.Condition
    rmb_mr: MemoryRegion | None = None
    sndbuf_mr: MemoryRegion | None = None
    handshake: Handshake | None = None
    outcome: Any = None  # (Any, not object: mypyc) HandshakeCompleted / FellBack / HandshakeFailed
    reset_reason: str = ""
    readiness: Readiness | None = None
    waiters: int = 0  # threads in cond.wait: notify only when someone listens (1.5 µs)
    released: bool = False
    on_release: list[Callable[[], None]] = field(default_factory=list)
    # called (lock held) once the handshake has an outcome: accept queues and
    # non-blocking connects finish the socket there, whichever thread polled
    on_outcome: Callable[[HostConn], None] | None = None
    local_peer: bool | None = None  # the other end is in this runtime (Stack.local_peer)
    ends: tuple[object, object] | None = None  # handshaking: (ours, peer's) TCP addresses
    aliases: dict[int, tuple[MemoryRegion, MemoryRegion]] = field(default_factory=dict)
    """Port -> (RMB, send buffer) registered on that port's RNIC too (:meth:`Stack.register_rmb`;
    port 0's are :attr:`rmb_mr` and :attr:`sndbuf_mr`)."""

    def undecided(self) -> bool:
        """The handshake has no outcome yet.  A method: after ``if hc.outcome is None``
        mypyc reads ``hc.outcome`` as None-typed in that branch, and a call that
        settled it meanwhile makes the read a TypeError."""
        return self.outcome is None

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


@mypyc_attr(allow_interpreted_subclasses=True)
class StackTap:
    """Something that watches one runtime's link traffic (``smcr trace``, tests): subclass
    it, override what you watch, set it as :attr:`Stack.tap`.

    Why a tap and not methods shadowed per instance: :class:`Stack` is a native class
    in the compiled build, whose compiled callers would never see a shadow; the
    runtime tests ``tap is None`` where it would call one, nothing more.  Called
    with the runtime's lock held, in whichever thread does the work: keep it short,
    never block, never call the runtime back.
    """

    def new_qp(self, stack: Stack, qpn: int) -> None:
        """The runtime made QP ``qpn`` (:meth:`Stack.new_qp`; it is in ``stack.qps``)."""

    def received(self, stack: Stack, qpn: int, messages: list[memoryview]) -> None:
        """SENDs that arrived on QP ``qpn``, before the engine gets them."""

    def control(self, stack: Stack, action: Action) -> None:
        """An engine action other than a post, before the runtime carries it out
        (:class:`~smcr.core.events.SendClc`: a CLC message about to go)."""

    def receive_clc(self, stack: Stack, conn: int, data: bytes) -> None:
        """CLC bytes read from connection ``conn``'s TCP socket, before the engine gets them."""


class Stack:
    """The per-process runtime (module docstring)."""

    def __init__(self, config: Config | None = None, max_buffers: int = 4096,
                 device: Device | None = None,
                 more_devices: Sequence[Device] = (),
                 pnet_table: PnetTable | None = None) -> None:  # fmt: skip
        """:param device: the RNIC (default: a new shm RNIC); see :func:`get_stack`.
        :param more_devices: further RNICs of the same kind (ports 1, 2...): links of a
            group go over them too (:mod:`smcr.stack.ports`); the runtime owns them.
        :param pnet_table: where the RNICs' PNET IDs come from (default: the host's,
            :mod:`smcr.pnet`)."""
        if config is None:
            config = Config(sndbuf_size=BUFFER, rmb_size=BUFFER)
        self.config = config
        self.pid = os.getpid()
        self.device = device if device is not None else ShmDevice(f"smcr{self.pid}")
        all_devices = [self.device, *more_devices]
        mtu = min(int(d.attr.active_mtu) for d in all_devices)
        if mtu < self.config.qp_mtu:  # CLC announces what this RNIC's port can carry
            self.config = replace(self.config, qp_mtu=mtu)
        if more_devices or self.config.max_links_v2 >= 2:
            # a second RNIC, or two links asked for (SMCR_MAX_LINKS): ADD LINK as Linux,
            # which with one RNIC offers an asymmetric link over it, and accepts a
            # peer's offer over another RNIC of the peer's
            self.config = replace(self.config, add_links=True)
        self.max_inline = min(d.attr.max_inline_data for d in all_devices)
        """Inline WRITE limit of this RNIC's QPs: a send this small skips the send buffer."""
        self._fused = self.max_inline >= SLOT  # CDCs go inline, with their WRITEs fused
        self.pd = self.device.alloc_pd()
        self.cq = self.device.create_cq(1 << 20)
        self.lock = threading.Lock()  # not reentrant: _sleep_on_cq releases it once
        mac = self.device.mac
        identity = LocalIdentity(self.device.gid, mac, secrets.token_bytes(2) + mac,
                                 hostname=make_hostname(socket.gethostname()),
                                 v2_capable=devices.serves_v2(self.device),
                                 netdev=self.device.netdev or self.device.name,
                                 more_ports=tuple(Port(d.gid, d.mac, d.netdev or d.name)
                                                  for d in more_devices))  # fmt: skip
        self.engine = Engine(self.config, identity, self)
        self._ueids = UeidTable()
        """The host's UEIDs (:mod:`smcr.ueid`), handed to the engine at each handshake."""
        self.qps: dict[int, QueuePair] = {}
        self._qp_setup: dict[int, list[tuple[QpAttr, QpAttrMask]]] = {}
        self.conns: dict[int, HostConn] = {}
        self._next_conn = 1
        self.max_buffers = max_buffers
        self._buffers_out = 0
        self._pool: dict[tuple[int, bool], list[MemoryRegion]] = {}
        self._retired: dict[int, HostConn] = {}
        """Released connections whose RMB the peer may still write (until :class:`ReuseRmb`)."""
        recv_buf, send_buf = bytearray(SLOT * RECV_SLOTS * 64), bytearray(SLOT * SEND_SLOTS)
        self._recv_mr = self.pd.reg_mr(recv_buf, AccessFlag.LOCAL_WRITE)
        self._recv_free = list(range(RECV_SLOTS * 64))
        self._recv_slot: dict[int, int] = {}  # wr_id -> slot
        self._recv_wr: dict[int, RecvWr] = {}  # wr_id -> its receive WR, reposted as is
        self._send_mr = self.pd.reg_mr(send_buf, AccessFlag.LOCAL_WRITE)
        self.ports = [PortRes(self.device, self.pd, self._recv_mr, self._send_mr)]
        """The runtime's RNICs by port (index into the engine's ``identity.ports``)."""
        for dev in more_devices:
            pd = dev.alloc_pd()  # the same slot buffers, registered on each RNIC
            self.ports.append(PortRes(dev, pd, pd.reg_mr(recv_buf, AccessFlag.LOCAL_WRITE),
                                      pd.reg_mr(send_buf, AccessFlag.LOCAL_WRITE)))  # fmt: skip
        self._pnet = pnet_table if pnet_table is not None else PnetTable()
        self._pnet_seen: tuple[Entry, ...] | None = None
        self._apply_pnet()
        self._keep_copy = len(self.ports) > 1
        """Inline sends also copy into the send buffer (:meth:`_copy_to_sndbuf`)."""
        self._qp_port: dict[int, int] = {}
        self._port_watcher: ports.PortWatcher | None = None
        """QPN -> port, for the QPs of ports other than 0."""
        self._send_off = 0
        self._repost: dict[int, list[RecvWr]] = {}
        self._repost_due = False  # some QP has REPOST_BATCH receives to post again
        self._qp_recv_ids: dict[int, list[int]] = {}  # qpn -> its receive WR ids (slots)
        self._recv_tail: dict[int, MemoryRegion] = {}  # qpn -> where long messages go on
        self._wr_ids = 1
        self._poller: str | None = None
        self._poller_ident = 0
        self._app_polled = 0.0
        self._sends_unprocessed = 0  # RoCE sends since send_fast last took the news
        self._timer_check = 0.0
        self._bg_wake = threading.Event()  # set by _wake_progress: the standby ends
        self._bell_r, self._bell_w = socket.socketpair()
        self._bell_r.setblocking(False)
        # a full doorbell already means a wake-up is pending: kick() must never block (it
        # is called with the lock held, and the poller it wakes needs the lock to drain it)
        self._bell_w.setblocking(False)
        self._clc_watch: dict[int, HostConn] = {}
        self._clc_ep = select.epoll()
        """The TCP sockets of :attr:`_clc_watch`, which pollers sleep on through this one
        descriptor: one added wakes a poller already asleep by itself (a doorbell ring
        cost the poller a wasted round: on every accepted connection, the thread in
        ``accept`` that polls).  Registered while in :attr:`_clc_watch` only: a socket is
        let go (:meth:`_unwatch_clc`) before it is closed."""
        self._clc_ends: dict[tuple[object, object], HostConn] = {}
        """Handshakes under way by their TCP connection's (ours, peer's) addresses: the
        other end of one is found when both ends are ours (:meth:`_clc_sent`)."""
        self._clc_local: list[HostConn] = []  # handshakes of ours that CLC was sent to
        self._clc_feeding = False
        self._tcp_watch: dict[int, HostConn] = {}
        """TCP sockets of SMC-R connections, watched for the peer's end (:meth:`_tcp_ended`);
        not over shm, whose RNIC itself sees a peer process die."""
        self._watch_tcp = not isinstance(self.device, ShmDevice)
        self._orphans: deque[tuple[HostConn, float | None]] = deque()
        """Connections whose socket was collected unclosed (:meth:`orphan`), for the progress
        thread; a deque: appended from any thread without the lock."""
        self._draining: dict[int, tuple[HostConn, float, int]] = {}
        """Closed connections (orphans, and closes without SO_LINGER: :meth:`close_later`)
        waiting for their send buffer before the closing CDC: (connection, deadline,
        bytes unsent at the last look)."""
        self._shutdowns: dict[int, HostConn] = {}  # SHUT_WR waiting for the send buffer
        self._corked = False
        """Some connection may hold corked bytes (:meth:`corked`)."""
        self._running = True
        self.tap: StackTap | None = None
        """What watches this runtime's link traffic (:class:`StackTap`), or None."""
        self.exiting = False
        """The interpreter is exiting (:meth:`close_at_exit`)."""
        self.stats = {"smc": 0, "fallback": 0, "handshake_errors": 0}
        self.fallback_reasons: Counter[tuple[int, int]] = Counter()
        """(local, peer) decline code -> count (Linux ``smc_stats`` fallback reasons)."""
        self._progress = threading.Thread(target=self._progress_thread, name="smcr-progress",
                                          daemon=True)  # fmt: skip
        self._progress.start()

    # ================================================================ provider

    def new_qp(self, port: int = 0) -> tuple[int, int]:
        """:class:`~smcr.core.engine.Provider`: a QP in RESET on ``port``'s RNIC, with a
        random initial PSN.

        Every port's QPs complete into the one CQ (:class:`PortRes`).  QP numbers are
        unique in the process (the engine finds a link by it): the RoCE RNIC draws
        them process-wide, the shm RNIC per device, so a number another port uses is
        drawn again.
        """
        res = self.ports[port]
        cap = QpCap(max_send_wr=SEND_SLOTS, max_recv_wr=RECV_SLOTS,
                    max_inline_data=self.max_inline)  # fmt: skip
        qp = res.pd.create_qp(self.cq, self.cq, cap)
        while qp.qp_num in self.qps or qp.qp_num in self._qp_port:
            again = res.pd.create_qp(self.cq, self.cq, cap)
            qp.destroy()
            qp = again
        self.qps[qp.qp_num] = qp
        if port:
            self._qp_port[qp.qp_num] = port
        tap = self.tap
        if tap is not None:
            tap.new_qp(self, qp.qp_num)
        return qp.qp_num, secrets.randbits(24)

    def register_rmb(self, conn: int, port: int) -> tuple[int, int]:
        """:class:`~smcr.core.engine.Provider`: the connection's RMB registered on ``port``'s
        RNIC too (a link over it joined the group), with its send buffer for local
        access (WRITEs posted on that port's QPs take it as source); they are
        deregistered when the buffers go back to the pool (:meth:`_give_back`)."""
        hc = self.conns.get(conn) or self._retired.get(conn)
        if hc is None or hc.rmb_mr is None or hc.sndbuf_mr is None or port == 0:
            raise ValueError(f"connection {conn}: no buffers to register on port {port}")
        pair = hc.aliases.get(port)
        if pair is None:
            pd = self.ports[port].pd
            rmb = _alias(pd, hc.rmb_mr)
            try:
                pair = hc.aliases[port] = (rmb, _alias(pd, hc.sndbuf_mr))
            except BaseException:
                rmb.dereg()
                raise
        return pair[0].rkey, pair[0].addr

    # ================================================================ ports

    def port_of(self, qpn: int) -> int:
        """The port (RNIC) a QP of this runtime is on."""
        return self._qp_port.get(qpn, 0)

    def reaches(self, port: int, gid: bytes) -> bool:
        """The engine's ``Provider.reaches``: whether our ``port`` has a path to a peer
        port's GID (RoCE: the kernel's route, :func:`ports.roce_reaches`; shm: every
        port reaches every shm RNIC of the host)."""
        dev = self.ports[port].device
        return not isinstance(dev, RoceDevice) or ports.roce_reaches(dev, gid)

    def port_down(self, port: int, reason: str) -> None:
        """An RNIC is gone (net device down, address lost, injected failure; lock held):
        every link over it fails (Linux ``smcr_port_err`` -> ``smcr_link_down_cond``).

        A link with an active sibling fails over (the engine moves its connections and
        tells the peer by DELETE LINK); a group's last link ends the group.  The QP goes
        to ERR, so what it still had posted completes as flushes (ignored: the link is
        gone by then), and no new link is made over the port until :meth:`port_up`.
        """
        res = self.ports[port]
        if not res.up:
            return
        res.up = False
        now = time.monotonic()
        qpns = [q for q in self.qps if self.port_of(q) == port]
        self.execute(self.engine.port_down(port, reason, now))
        for qpn in qpns:  # (the engine's links over the port are failed; any other QP too)
            if qpn in self.qps:
                self.execute(self.engine.link_failed(qpn, f"port {port} down: {reason}", now))
            qp = self.qps.get(qpn)
            if qp is not None:
                with contextlib.suppress(OSError):
                    qp.modify(QpAttr(qp_state=QpState.ERR), QpAttrMask.STATE)

    def watch_ports(self) -> None:
        """Follow the RoCE ports' net devices (:class:`smcr.stack.ports.PortWatcher`) until
        :meth:`close`."""
        if self._port_watcher is None:
            self._port_watcher = ports.PortWatcher(self)

    def port_up(self, port: int) -> None:
        """An RNIC is back (lock held): groups down to one link add a link over it again
        (the server offers ADD LINK, Linux ``smcr_port_add``)."""
        res = self.ports[port]
        if res.up:
            return
        res.up = True
        self.execute(self.engine.port_up(port, time.monotonic()))

    # ================================================================ buffers

    def alloc_buffers(self, rmb_size: int, sndbuf_size: int) -> tuple[MemoryRegion,
                                                                       MemoryRegion] | None:
        """An RMB and a send buffer from the pool, or None when the pool is exhausted."""
        if self._buffers_out >= self.max_buffers:
            return None
        try:
            rmb = self._take(rmb_size, True)
            snd = self._take(sndbuf_size, False)
        except OSError:
            return None
        self._buffers_out += 1
        return rmb, snd

    def _take(self, size: int, remote: bool) -> MemoryRegion:
        free = self._pool.get((size, remote))
        if free:
            return free.pop()
        access = RMB_ACCESS if remote else AccessFlag.LOCAL_WRITE
        return self.pd.alloc_mr(size, access)

    def _give_back(self, hc: HostConn) -> None:
        for pair in hc.aliases.values():  # the other RNICs' registrations end with the conn
            for alias in pair:
                alias.dereg()
        hc.aliases.clear()
        for mr, remote in ((hc.rmb_mr, True), (hc.sndbuf_mr, False)):
            if mr is not None:
                self._pool.setdefault((mr.length, remote), []).append(mr)
        if hc.rmb_mr is not None:
            self._buffers_out -= 1
        hc.rmb_mr = hc.sndbuf_mr = None

    # ================================================================ conns

    def _apply_pnet(self) -> None:
        """Give each port of the engine's identity its PNET ID from the table (Linux sets
        ``smcibdev->pnetid`` when an entry is added; here a changed table reaches the
        runtime at its next connection).  A shm RNIC is ``shm<i>`` in the table, a
        RoCE RNIC its device name or its net device (:mod:`smcr.pnet`)."""
        entries = self._pnet.current()
        if entries is self._pnet_seen:  # unchanged (the table hands out the same tuple)
            return
        self._pnet_seen = entries
        ids = []
        for i, res in enumerate(self.ports):
            dev = res.device
            names = (dev.name, f"shm{i}") if isinstance(dev, ShmDevice) else (dev.name,)
            ids.append(lookup(entries, dev.netdev, names))
        ident = self.engine.identity
        if ids != [p.pnetid for p in ident.ports]:
            self.engine.identity = replace(ident, pnetid=ids[0], more_ports=tuple(
                replace(p, pnetid=x) for p, x in zip(ident.more_ports, ids[1:], strict=True)))

    def new_conn(self, tcp: socket.socket) -> HostConn:
        """Register a connection (lock held by the caller)."""
        hc = HostConn(self._next_conn, tcp, threading.Condition(self.lock))
        self._next_conn += 1
        self.conns[hc.conn_id] = hc
        return hc

    def start_handshake(self, hc: HostConn, client: bool, local_ip: ipaddress.IPv4Address
                        | ipaddress.IPv6Address, rmb_size: int, sndbuf_size: int,
                        polled: bool = False) -> None:  # fmt: skip
        """Allocate buffers and start the CLC handshake (lock held).

        A size of 0 means the default (:attr:`config`, :data:`BUFFER`).

        :param polled: the caller waits for the outcome with :meth:`wait` right after
            (a blocking ``connect``): it polls the TCP socket itself, so no other
            poller is woken for it (a doorbell ring, or the progress thread's wakeup,
            would only cost a thread switch and a wasted poll round).
        """
        local_ip = devices.prefix_ip(self.device, local_ip)
        bufs = self.alloc_buffers(rmb_size or self.config.rmb_size,
                                  sndbuf_size or self.config.sndbuf_size)  # fmt: skip
        rmb = None
        snd = 0
        if bufs is not None:
            hc.rmb_mr, hc.sndbuf_mr = bufs
            rmb = Rmb(bufs[0].rkey, bufs[0].addr, bufs[0].length)
            snd = bufs[1].length
        now = time.monotonic()
        self.engine.ueids = self._ueids.current()  # Linux reads its table at every handshake
        self._apply_pnet()
        if client:
            actions = self.engine.connect(hc.conn_id, rmb, local_ip, now, snd)
        else:
            actions = self.engine.accept(hc.conn_id, rmb, local_ip, now, snd)
        hc.handshake = self.engine.handshake(hc.conn_id)
        self.execute(actions)
        if hc.outcome is None:
            hc.tcp.setblocking(False)
            fd = hc.tcp.fileno()
            self._clc_watch[fd] = hc
            try:
                self._clc_ep.register(fd, select.EPOLLIN)
            except FileExistsError:  # (a number registered before: never closed unwatched)
                self._clc_ep.modify(fd, select.EPOLLIN)
            with contextlib.suppress(OSError):
                hc.ends = (hc.tcp.getsockname(), hc.tcp.getpeername())
                self._clc_ends[hc.ends] = hc
            if not client:  # the client's Proposal is often here already: no thread hop
                self._clc_read(hc)
            if hc.undecided() and not polled and self._poller is None:
                # (not `hc.outcome is None` again: see undecided) nobody polls (a thread
                # that does sleeps on _clc_ep, which has it now): the standing-by progress
                # thread watches it from now on
                self._wake_progress()

    def _clc_read(self, hc: HostConn) -> None:
        """Feed CLC bytes from a handshaking connection's TCP socket to the engine."""
        now = time.monotonic()
        try:
            data = hc.tcp.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.execute(self._receive_clc(hc.conn_id, data, now))
        else:
            self._unwatch_clc(hc)  # EOF stays readable: look no more
            self.execute(self.engine.tcp_closed(hc.conn_id, now))

    def _receive_clc(self, conn_id: int, data: bytes, now: float) -> list[Action]:
        """CLC bytes to the engine (and to the tap: where smcr trace sees them)."""
        tap = self.tap
        if tap is not None:
            tap.receive_clc(self, conn_id, data)
        return self.engine.receive_clc(conn_id, data, now)

    def _unwatch_clc(self, hc: HostConn) -> None:
        """The handshake reads no more CLC (lock held)."""
        fd = hc.tcp.fileno()
        if self._clc_watch.pop(fd, None) is not None:
            with contextlib.suppress(OSError, ValueError):
                self._clc_ep.unregister(fd)
        if hc.ends is not None:
            self._clc_ends.pop(hc.ends, None)
            hc.ends = None

    def _clc_sent(self, hc: HostConn) -> None:
        """CLC went out on ``hc``'s TCP connection: if its other end is a handshake of this
        runtime too (both ends in one process), that end reads it now (:meth:`execute`
        ends with it), not when the progress thread next looks -- as TCP over loopback
        has delivered when ``send`` returns.  Why: the server's handshake then ends,
        and its connection is in the accept queue, before the client's ``connect``
        returns; a program that connects, talks, closes and then closes its listener
        (CPython's asyncio test_streams does) found it closed before it was queued,
        one time in four."""
        if hc.ends is None:
            return
        peer = self._clc_ends.get((hc.ends[1], hc.ends[0]))
        if peer is not None and peer is not hc:
            self._clc_local.append(peer)

    def _feed_local_clc(self) -> None:
        """Let the handshakes of ours that CLC was sent to read it (:meth:`_clc_sent`)."""
        if self._clc_feeding:
            return  # (the outermost execute feeds them)
        self._clc_feeding = True
        try:
            while self._clc_local:
                peer = self._clc_local.pop(0)
                if peer.ends is not None and peer.outcome is None:
                    self._clc_read(peer)
        finally:
            self._clc_feeding = False

    def _tcp_ended(self, hc: HostConn) -> None:
        """An SMC-R connection's TCP socket became readable: the peer closed it, or died.

        Over the RoCE RNIC a killed peer process leaves only its kernel's FIN/RST,
        so the engine tests the link at once (:meth:`Engine.probe_link`): a live
        peer answers, a dead one does not and the connection is reset within
        ``llc_wait`` (or the QP's retry exceeded).  The socket is watched no more
        (bytes there, which SMC-R never sends, would wake us in a loop).
        """
        try:
            hc.tcp.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            self._tcp_watch[hc.tcp.fileno()] = hc  # a spurious wakeup
            return
        except OSError:
            pass
        if not hc.released:
            self.execute(self.engine.probe_link(hc.conn_id, time.monotonic()))

    def unwatch_tcp(self, hc: HostConn) -> None:
        """Stop watching a connection's TCP socket (before it is closed; lock held)."""
        self._tcp_watch.pop(hc.tcp.fileno(), None)

    def local_peer(self, hc: HostConn, c: Connection) -> bool:
        """Whether the connection's other end is in this runtime too (its link's peer QP
        is ours: both ends in one process).  Its sends and reads then take the
        completions they made for the other end at once (:meth:`process`), so that the
        other end's readiness descriptor changes before the call returns, as a TCP
        peer's does over loopback; else it changes when the progress thread next wakes,
        and an event loop that runs both ends sees the other end late."""
        local = hc.local_peer
        if local is None:
            links = self.engine.links
            link = links.get(c.qpn)
            peer = links.get(link.peer_qpn) if link is not None else None
            local = hc.local_peer = peer is not None and peer.peer_qpn == c.qpn
        return local

    def engine_conn(self, hc: HostConn) -> Connection | None:
        """The engine's connection record."""
        return self.engine.conns.get(hc.conn_id)

    # ================================================================ closing

    def shutdown_write(self, hc: HostConn) -> None:
        """``shutdown(SHUT_WR)`` (lock held): the done-writing CDC goes after the last byte
        of the send buffer, as TCP's FIN goes after its data, however long the peer takes
        to make room for it; until then the connection is in :attr:`_shutdowns`."""
        c = self.engine.conns.get(hc.conn_id)
        if c is None:
            return
        self.uncork(hc)
        if c.tx_pending() and not c.reset_reason and not c.peer_closed:
            self._shutdowns[hc.conn_id] = hc
            return
        self.execute(self.engine.shutdown_write(hc.conn_id, time.monotonic()))
        self.update_readiness(hc)

    def _shutdown_sent(self, touched: set[int]) -> None:
        """Send the done-writing CDCs whose send buffers are out now (lock held)."""
        for conn_id in touched & self._shutdowns.keys():
            c = self.engine.conns.get(conn_id)
            if c is None or not c.tx_pending() or c.reset_reason or c.peer_closed:
                del self._shutdowns[conn_id]
                if c is not None:
                    self.execute(self.engine.shutdown_write(conn_id, time.monotonic()))

    def app_close(self, hc: HostConn) -> None:
        """The application closed the connection (lock held; the host waited for the send
        buffer first): the closing CDC (:meth:`Engine.close`); a connection the engine has
        forgotten already is let go here."""
        self._shutdowns.pop(hc.conn_id, None)
        self.execute(self.engine.close(hc.conn_id, time.monotonic()))
        self._let_go(hc)

    def abort(self, hc: HostConn) -> None:
        """Abortive close (lock held): ``SO_LINGER`` on with a linger time of 0
        (:meth:`Engine.abort`): the send buffer dropped, an abort CDC; the application is
        done at once, the connection and its RMB go when the peer's closing CDC answers
        (:meth:`Connection.app_abort`).  The TCP connection is reset now, as a TCP
        socket's abortive close resets it (a peer that looks at its TCP socket, ssl's
        ``wrap_socket`` for one, sees it unconnected at once); only the RMB waits."""
        actions = self.engine.abort(hc.conn_id, time.monotonic())
        if self.engine_conn(hc) is None or hc.released:
            self.execute(actions)
        else:  # (no FIN before the reset: a peer in CLOSE_WAIT would read EPIPE, not ECONNRESET)
            self.execute([a for a in actions if not isinstance(a, ShutdownTcp)])
            self.unwatch_tcp(hc)
            with contextlib.suppress(OSError):
                hc.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
                hc.tcp.close()
        self._let_go(hc)

    def _let_go(self, hc: HostConn) -> None:
        """After the application's close: a connection the engine has forgotten goes."""
        if self.engine_conn(hc) is None and not hc.released:
            hc.released = True
            self.conns.pop(hc.conn_id, None)
            self.unwatch_tcp(hc)
            with contextlib.suppress(OSError):
                hc.tcp.close()

    def orphan(self, hc: HostConn, linger: float | None) -> None:
        """Close a connection whose socket was garbage-collected unclosed; any thread,
        lock-free (the collector may run inside code that holds :attr:`lock`).

        The progress thread does it (:meth:`_reap_orphans`): it waits, without
        blocking anyone, for the send buffer to go out as ``close()`` would
        (``linger`` seconds, or ``close_wait_tx`` when None; 0 aborts), then
        sends the closing CDC.  Nothing happens in a runtime that is closed or
        was inherited by a forked child.
        """
        if not self._running or self.pid != os.getpid():
            return
        self._orphans.append((hc, linger))
        self.kick()
        self._wake_progress()

    def close_later(self, hc: HostConn) -> None:
        """The application closed a connection whose send buffer is not out yet, without
        ``SO_LINGER`` (lock held): ``close`` returns at once, as TCP's does, and the
        progress thread sends the rest, then the closing CDC (:meth:`_reap_orphans`).
        Why: TCP's kernel goes on sending after ``close``; a program whose peer is
        served by the very thread that closes (an event loop running both ends)
        would wait in ``close`` for a peer that cannot read meanwhile, and lose the
        rest when the wait ended (CPython's asyncio test_sendfile).  The wait ends
        after ``close_wait_tx`` (2 s) in which the peer took nothing, not 2 s in all."""
        self.uncork(hc)  # (nothing follows: corked bytes go now)
        c = self.engine_conn(hc)
        self._draining[hc.conn_id] = (hc, time.monotonic() + self.config.close_wait_tx,
                                      c.tx_pending() if c is not None else 0)  # fmt: skip
        self.kick()
        self._wake_progress()

    def _reap_orphans(self) -> None:
        """Close the orphans whose send buffer is out or whose wait is over (lock held)."""
        now = time.monotonic()
        while self._orphans:
            hc, linger = self._orphans.popleft()
            if linger == 0:
                self.abort(hc)
            else:
                wait = self.config.close_wait_tx if linger is None else linger
                c = self.engine_conn(hc)
                self._draining[hc.conn_id] = (hc, now + wait, c.tx_pending() if c else 0)
        for conn_id, (hc, deadline, unsent) in list(self._draining.items()):
            c = self.engine_conn(hc)
            if (c is None or c.tx_pending() == 0 or bool(c.reset_reason) or c.peer_closed
                    or now >= deadline):  # fmt: skip
                del self._draining[conn_id]
                self.app_close(hc)
            elif c.tx_pending() < unsent:  # the peer reads: it gets the time again
                self._draining[conn_id] = (hc, now + self.config.close_wait_tx,
                                           c.tx_pending())  # fmt: skip

    # ================================================================ actions

    def execute(self, actions: list[Action]) -> None:
        """Run actions in order, then dispatch the engine's events (lock held)."""
        if not actions:
            if self.engine.has_events():
                self._dispatch_events()
            return
        # WRs of one QP are posted together, in order.  Where the RNIC takes inline
        # WRs, WRITEs (from the send buffer) and the CDC behind them go as one fused
        # batch (QueuePair.post_writes_send): no WR objects, no SGE look-ups
        wrs: list[SendWr] = []
        writes: list[tuple[int, int, memoryview]] = []
        wr_qpn = 0
        fused = self._fused
        for a in actions:
            kind = type(a)
            if kind is RdmaWrite or kind is PostSend:
                if (wrs or writes) and a.qpn != wr_qpn:  # type: ignore[union-attr]
                    self._post(wr_qpn, wrs + _write_wrs(writes))
                    wrs, writes = [], []
                wr_qpn = a.qpn  # type: ignore[union-attr]
                if isinstance(a, RdmaWrite):
                    hc = self.conns[a.conn]
                    mr = hc.aliases[self._qp_port[a.qpn]][1] if a.qpn in self._qp_port \
                        else hc.sndbuf_mr  # fmt: skip
                    assert mr is not None
                    if fused:
                        off = a.src_offset
                        writes.append((a.remote_addr, a.rkey, mr.buf[off : off + a.length]))
                    else:
                        sge = Sge(mr.addr + a.src_offset, a.length, mr.lkey)
                        wrs.append(SendWr(wr_id=0, opcode=_WRITE, remote_addr=a.remote_addr,
                                          rkey=a.rkey, sg_list=(sge,)))  # fmt: skip
                elif isinstance(a, PostSend):
                    if fused and not wrs:
                        self._post(wr_qpn, wrs, writes, a)
                        writes = []
                    else:
                        wrs.append(self._send_wr(a))
            else:
                if wrs or writes:
                    self._post(wr_qpn, wrs + _write_wrs(writes))
                    wrs, writes = [], []
                self._control(a)
        if wrs or writes:
            self._post(wr_qpn, wrs + _write_wrs(writes))
        self._dispatch_events()
        if self._clc_local:
            self._feed_local_clc()

    def send_inline(self, c: Connection, data: memoryview, request: bool = False) -> None:
        """The data path (lock held): ``data`` (at most ``c.direct_room()`` bytes, at most
        :attr:`max_inline`) RDMA-written from the caller's buffer, then its CDC, as one
        fused batch (:meth:`Connection.write_inline`, :meth:`QueuePair.post_writes_send`).

        :param request: the CDC asks the peer to answer (:meth:`Connection.echo_wanted`).
        """
        if self._keep_copy:
            self._copy_to_sndbuf(c, data)
        writes, cdc, wr_id, signaled = c.write_inline(data, request)
        qp = self.qps.get(c.qpn)
        try:
            if qp is None:
                raise OSError(errno.ENOTCONN, "the link's QP is gone")
            qp.post_writes_send(writes, cdc, wr_id, signaled)
        except OSError:  # a full send queue or a dead QP: the general path's waiting and verdict
            self._post(c.qpn, [], writes, PostSend(c.qpn, cdc, wr_id, signaled))
        if self.engine.has_events():
            self._dispatch_events()

    def send_fast(self, hc: HostConn, c: Connection, data: memoryview) -> int:
        """A send's common cases in one call (lock held; no urgent data): corked into the
        send buffer (:meth:`Connection.cork` says so: the peer's answer flushes it),
        RDMA-written inline when all of it fits now (:meth:`send_inline`), or, on RNICs
        without inline sends (RoCE), copied into the send buffer when all of it fits
        there, after the news that came meanwhile (:meth:`process`: acknowledgements and
        the peer's cursors free room), as the socket's general path does.

        Why here and not in the socket: this module is compiled (:mod:`smcr.native`), the
        socket's is not, and a small write's cost is mostly these few steps' Python.

        :returns: the bytes taken (all of ``data``), or -1 when no case applies (the
            socket's general path then waits, copies or splits).
        """
        n = len(data)
        if c.echo_pending and c.cork(n):
            ring_write(hc.sndbuf, c.tx_app, data)
            c.corked(n)
            self.corked(c)
        elif self.max_inline:
            if not 0 < n <= c.direct_room():
                return -1
            self.send_inline(c, data, c.unanswered and not c.echo_pending and c.echo_wanted(n))
            if self.local_peer(hc, c):
                self.process()
        else:
            self._sends_unprocessed += 1
            if self._sends_unprocessed >= SENDS_PER_PROCESS or c.sndbuf_space() < 4 * n:
                self._sends_unprocessed = 0
                self.process()
                # (this thread took the news itself: the progress thread stands by meanwhile,
                # rather than wake for each acknowledgement only to find it taken, and take
                # the GIL and the lock from this thread to do so: _standing_by)
                self._app_polled = time.monotonic()
            if (not 0 < n <= c.sndbuf_space() or c.tx_flags or c.peer_closed or c.reset_reason
                    or c.urg_tx_end is not None):  # fmt: skip
                return -1  # (what process() took may have ended it: the general path says so)
            ring_write(hc.sndbuf, c.tx_app, data)
            actions: list[Action] = []
            c.written(n, actions)
            if actions:
                self.execute(actions)
            if self.local_peer(hc, c):
                self.process()
        if hc.readiness is not None:
            self.update_readiness(hc)
        return n

    def recv_fast(self, hc: HostConn, c: Connection, out: memoryview, waitall: bool) -> int:
        """A read's common case in one call (lock held): bytes are there, no urgent byte
        among them, the RMBE not full (a full one is counted by the caller), and with
        ``waitall`` all of ``out`` there: copy them out and consume them (the consumer
        cursor update goes when due, :meth:`Connection.consumed`).  Compiled for the same
        reason as :meth:`send_fast`.

        :returns: the bytes copied, or -1 when the case does not apply (the socket's
            general path then waits, stops at the urgent byte, or reads in pieces).
        """
        cons = c.rx_cons
        avail = c.rx_prod - cons
        rmb = hc.rmb
        size = len(rmb)
        n = len(out)
        if (avail <= 0 or avail >= size or not n or c.urg_rx_pos is not None
                or (waitall and avail < n)):  # fmt: skip
            return -1
        n = min(n, avail)
        ring_read(rmb, cons, out[:n])
        actions: list[Action] = []
        c.consumed(n, actions)
        if actions:
            self.execute(actions)
        if self.local_peer(hc, c):  # (a consumer cursor update, when one went)
            self.process()
        if hc.readiness is not None:
            self.update_readiness(hc)
        return n

    def corked(self, c: Connection) -> None:
        """A send of ``c`` was corked (lock held): the peer's answer flushes it, and someone
        must be there to take that answer while the application does other things -- the
        progress thread, which therefore does not stand by (:meth:`_progress_step`) while
        bytes are corked.  Free when a corking was already under way."""
        if not self._corked:
            self._corked = True
            self._wake_progress()

    def uncork(self, hc: HostConn | None = None) -> None:
        """Send the corked bytes (:meth:`corked`) of ``hc``'s connection, or of every
        connection, now (lock held): no send will come after a close or at exit, and
        waiting for the peer's answer would only delay the close -- or, at exit, lose
        the bytes when the links end first."""
        conns = self.engine.conns
        ids = list(conns) if hc is None else [hc.conn_id]
        now = time.monotonic()
        for conn_id in ids:
            c = conns.get(conn_id)
            if c is not None and c.tx_app > c.tx_sent and not c.reset_reason:
                self.execute(self.engine.data_written(conn_id, 0, now))

    def _copy_to_sndbuf(self, c: Connection, data: memoryview) -> None:
        """Put inline-sent bytes into the send buffer too, where they would have been copied
        on the general path: with several links a failover re-sends from the last
        completed CDC, out of the send buffer (:meth:`Connection.switch_cursor`)."""
        ring_write(self.conns[c.id].sndbuf, c.tx_sent, data)

    def _send_wr(self, a: PostSend) -> SendWr:
        """``a``'s message copied into the next send slot (a message longer than one, an
        SMC-Rv2 LLC message such as ADD LINK v2 with its rkeys, takes as many slots as it
        needs, never wrapping around the ring's end)."""
        mr = self.ports[self._qp_port[a.qpn]].send_mr if a.qpn in self._qp_port else self._send_mr
        off = self._send_off
        span = max(1, -(-len(a.data) // SLOT)) * SLOT
        if off + span > len(mr.buf):
            off = 0
        self._send_off = (off + span) % len(mr.buf)
        mr.buf[off : off + len(a.data)] = a.data
        # solicited, as Linux smc_wr_tx_send posts every CDC and LLC message (the SE bit
        # of the BTH on the wire)
        flags = _SOLICITED | (SendFlag.SIGNALED if a.signaled else SendFlag.NONE)
        return SendWr(wr_id=a.wr_id, opcode=_SEND, send_flags=flags,
                      sg_list=(Sge(mr.addr + off, len(a.data), mr.lkey),))  # fmt: skip

    def _post(self, qpn: int, wrs: list[SendWr], writes: Sequence[tuple[int, int, memoryview]]
              = (), cdc: PostSend | None = None) -> None:  # fmt: skip
        """Post ``wrs`` in order, or with ``cdc`` the fused batch of ``writes`` (inline) and
        its SEND (:meth:`QueuePair.post_writes_send`).

        A full send queue (the peer takes no SENDs: RNR) is waited out for up to
        ``SMC_WR_TX_WAIT_FREE_SLOT_TIME`` (10 s), as Linux waits for a free slot,
        then the link is declared down.  The lock stays held meanwhile: releasing
        it could let another thread post behind these WRs' backs.
        """
        qp = self.qps.get(qpn)
        if qp is None:
            return
        deadline = 0.0
        while True:
            try:
                if cdc is not None:
                    qp.post_writes_send(writes, cdc.data, cdc.wr_id, cdc.signaled)
                else:
                    qp.post_send(wrs)
                return
            except OSError as exc:
                now = time.monotonic()
                deadline = deadline or now + WAIT_FREE_SLOT
                if exc.errno == errno.ENOMEM and now < deadline:
                    time.sleep(0.001)
                    continue
                self.execute(self.engine.link_failed(qpn, f"post_send: {exc}", now))
                return

    def _control(self, a: Action) -> None:
        tap = self.tap
        if tap is not None:
            tap.control(self, a)
        if isinstance(a, SendClc):
            hc = self.conns.get(a.conn)
            if hc is not None:
                with contextlib.suppress(OSError):
                    hc.tcp.sendall(a.data)
                    self._clc_sent(hc)
        elif isinstance(a, QpToRtr):
            self._qp_rtr(a)
        elif isinstance(a, QpToRts):
            qp = self.qps.get(a.qpn)
            steps = self._qp_setup.pop(a.qpn, None)
            if qp is not None and steps is not None:
                try:
                    qp.modify(*steps[2])
                except OSError as exc:
                    self.execute(self.engine.link_failed(a.qpn, f"RTS: {exc}", time.monotonic(),
                                                         DeclineCode.ERR_RDYLNK))  # fmt: skip
        elif isinstance(a, DestroyQp):
            self._destroy_qp(a.qpn)
        elif isinstance(a, ShutdownTcp):
            hc = self.conns.get(a.conn)
            if hc is not None:
                with contextlib.suppress(OSError):
                    hc.tcp.shutdown(a.how)
        elif isinstance(a, ReleaseConnection):
            self._release(a.conn)
        elif isinstance(a, ReuseRmb):
            hc = self._retired.pop(a.conn, None)
            if hc is not None:
                self._give_back(hc)

    def _destroy_qp(self, qpn: int) -> None:
        """Destroy a QP; its receive slots go back to the pool.

        A link cleared while its group lives (failover) is first moved to ERR: what it
        had delivered completes into the CQ and its other receives flush (Linux
        ``smc_wr_drain_cq`` before ``smcr_link_clear``); their slots come back as those
        completions are taken, and the engine still applies the CDCs among them
        (:attr:`Engine.late_links`).  Otherwise the slots come back at once.
        """
        self._qp_port.pop(qpn, None)
        qp = self.qps.pop(qpn, None)
        drained = False
        if qp is not None:
            if qpn in self.engine.late_links:
                with contextlib.suppress(OSError):
                    qp.modify(QpAttr(qp_state=QpState.ERR), QpAttrMask.STATE)
                    drained = True
            qp.destroy()
        ids = self._qp_recv_ids.pop(qpn, ())
        if drained:  # (its receives taken from the CQ next are not reposted: slots back)
            self._repost_due = True
            return  # (its tail buffer stays: a long message may be among them)
        tail = self._recv_tail.pop(qpn, None)
        if tail is not None:
            with contextlib.suppress(OSError):
                tail.dereg()
        self._repost.pop(qpn, None)
        for wr_id in ids:  # receive slots back to the pool
            slot = self._recv_slot.pop(wr_id, None)
            if slot is not None:
                self._recv_free.append(slot)
                self._recv_wr.pop(wr_id, None)

    def _qp_rtr(self, a: QpToRtr) -> None:
        qp = self.qps[a.qpn]
        steps = rc_bring_up(dgid=a.peer_gid, dest_qp_num=a.peer_qpn, rq_psn=a.peer_psn,
                            sq_psn=self._psn_of(a.qpn), access=QP_ACCESS,
                            path_mtu=PathMtu(max(1, min(a.mtu, 5))))  # fmt: skip
        try:
            qp.modify(*steps[0])
            qp.modify(*steps[1])
            wrs = []
            ids = self._qp_recv_ids.setdefault(a.qpn, [])
            port = self.ports[self._qp_port.get(a.qpn, 0)]
            recv_mr = port.recv_mr
            tail = self._recv_tail.get(a.qpn)
            if tail is None:
                tail = self._recv_tail[a.qpn] = port.pd.reg_mr(bytearray(V2_MSG - SLOT),
                                                               AccessFlag.LOCAL_WRITE)  # fmt: skip
            for _ in range(RECV_SLOTS):
                slot = self._recv_free.pop()
                wr_id = self._wr_ids
                self._wr_ids += 1
                ids.append(wr_id)
                self._recv_slot[wr_id] = slot
                head = Sge(recv_mr.addr + slot * SLOT, SLOT, recv_mr.lkey)
                wr = RecvWr(wr_id=wr_id, sg_list=(head, Sge(tail.addr, tail.length, tail.lkey)))
                self._recv_wr[wr_id] = wr
                wrs.append(wr)
            qp.post_recv(wrs)
        except (OSError, IndexError) as exc:
            self.execute(self.engine.link_failed(a.qpn, f"RTR: {exc}", time.monotonic(),
                                                 DeclineCode.ERR_RDYLNK))  # fmt: skip
            return
        self._qp_setup[a.qpn] = steps

    def _psn_of(self, qpn: int) -> int:
        link = self.engine.links.get(qpn)
        return link.psn if link is not None else 0

    def _release(self, conn_id: int) -> None:
        hc = self.conns.pop(conn_id, None)
        if hc is None:
            return
        hc.released = True
        self.unwatch_tcp(hc)
        c = self.engine.conns.get(conn_id)
        if c is not None:  # smcr stats: its bytes, which its cursors counted (smcr.diag)
            COUNTERS.released(c)
        actions = self.engine.release(conn_id, time.monotonic())
        self._retired[conn_id] = hc  # its buffers go back to the pool at ReuseRmb
        with contextlib.suppress(OSError):
            hc.tcp.close()
        if hc.readiness is not None:
            hc.readiness.close()
        self.execute(actions)

    def _dispatch_events(self) -> None:
        while (ev := self.engine.next_event()) is not None:
            if _DEBUG:
                print(f"smcr[{os.getpid()}] {ev}", flush=True)
            hc = self.conns.get(getattr(ev, "conn", -1))
            if hc is None:
                continue
            if isinstance(ev, (HandshakeCompleted, FellBack, HandshakeFailed)):
                hc.outcome = ev
                self._unwatch_clc(hc)
                if self._poller == "app" and self._poller_ident != threading.get_ident():
                    self.kick()  # the waiting app thread sleeps on the CQ, not on hc.cond
                key = {HandshakeCompleted: "smc", FellBack: "fallback",
                       HandshakeFailed: "handshake_errors"}[type(ev)]  # fmt: skip
                self.stats[key] += 1
                if isinstance(ev, FellBack):
                    self.fallback_reasons[(ev.local_code, ev.peer_code)] += 1
                if not isinstance(ev, HandshakeCompleted):
                    self._give_back(hc)
                    self.conns.pop(hc.conn_id, None)
                elif self._watch_tcp:
                    self._tcp_watch[hc.tcp.fileno()] = hc
                if hc.on_outcome is not None:
                    try:
                        hc.on_outcome(hc)
                    except Exception:  # the socket layer's; progress must go on for all
                        traceback.print_exc(file=sys.stderr)
            elif isinstance(ev, ConnectionReset):
                hc.reset_reason = ev.reason
            if hc.waiters:  # (as process(): only when someone listens)
                hc.cond.notify_all()
            self.update_readiness(hc)

    def drop_readiness(self, hc: HostConn) -> None:
        """The application closed the connection: its readiness descriptor goes now (lock
        held), not when the close handshake ends, as a closed socket's descriptor is
        gone when ``close()`` returns (``epoll.unregister`` of it fails with EBADF)."""
        if hc.readiness is not None:
            hc.readiness.close()
            hc.readiness = None

    def update_readiness(self, hc: HostConn) -> None:
        """Bring the connection's readiness descriptor up to date (if anyone asked for it)."""
        r = hc.readiness
        if r is None:
            return
        c = self.engine.conns.get(hc.conn_id)
        if c is None:
            r.set(True, True)
            return
        readable = c.rx_available() > 0 or c.peer_done or bool(c.reset_reason)
        writable = c.sndbuf_space() > 0 or bool(c.tx_flags) or bool(c.reset_reason)
        r.set(readable, writable)

    # ================================================================ progress

    def process(self, first: list[WorkCompletion] | None = None) -> None:
        """Take every completion and run due timers (lock held); wake touched waiters."""
        engine, now = self.engine, time.monotonic()
        wcs = first or self.cq.poll(64)
        recv_slot, recv_buf = self._recv_slot, self._recv_mr.buf
        while wcs:
            # consecutive receives of one QP go to the engine together (it coalesces CDCs)
            batch: list[memoryview] = []
            batch_qpn = 0
            for wc in wcs:
                slot = recv_slot.get(wc.wr_id) if wc.opcode is _RECV else None
                if slot is None or wc.status is not _SUCCESS:
                    if batch:
                        self._received(batch_qpn, batch, now)
                        batch = []
                    self._completion(wc, now)
                    continue
                if batch and wc.qp_num != batch_qpn:
                    self._received(batch_qpn, batch, now)
                    batch = []
                batch_qpn = wc.qp_num
                off = slot * SLOT
                if wc.byte_len <= SLOT:
                    batch.append(recv_buf[off : off + wc.byte_len])
                else:
                    batch.append(self._long_message(wc, off))
                self._again(batch_qpn, wc.wr_id)
            if batch:
                self._received(batch_qpn, batch, now)
            # a full batch may have left more; a short one did not (anything newer
            # rings the armed CQ, and a waiter arms before it sleeps)
            wcs = self.cq.poll(64) if len(wcs) == 64 else []
        if self._repost_due:
            self._repost_due = False
            self._post_receives(False)
        if now >= self._timer_check:  # engine deadlines are >= 1 s away when made
            deadline = engine.get_timer()
            if deadline is not None and deadline <= now:
                self.execute(engine.handle_timer(now))
                deadline = engine.get_timer()
            self._timer_check = now + TIMER_GRAIN
            if deadline is not None:
                self._timer_check = min(self._timer_check, deadline)
        touched = engine.touched
        if not touched:
            return
        if self._shutdowns:
            self._shutdown_sent(touched)
        engine.touched = set()
        if self._poller == "app" and self._poller_ident != threading.get_ident():
            self.kick()  # the app poller may sleep on a doorbell this thread drained
        for conn_id in touched:
            hc = self.conns.get(conn_id)
            if hc is not None:
                if hc.waiters:
                    hc.cond.notify_all()
                if hc.readiness is not None:
                    self.update_readiness(hc)

    def _long_message(self, wc: WorkCompletion, off: int) -> memoryview:
        """A message longer than a slot: its slot, then the rest in its QP's tail buffer."""
        tail = self._recv_tail[wc.qp_num]
        data = bytes(self._recv_mr.buf[off : off + SLOT]) + bytes(tail.buf[: wc.byte_len - SLOT])
        return memoryview(data)

    def _received(self, qpn: int, messages: list[memoryview], now: float) -> None:
        """SENDs that arrived on a QP, in order, to the engine (their slots are not
        reposted before this returns)."""
        tap = self.tap
        if tap is not None:
            tap.received(self, qpn, messages)
        engine = self.engine
        actions = engine.receive_wrs(qpn, messages, now)
        if actions or engine.has_events():
            self.execute(actions)

    def _again(self, qpn: int, wr_id: int) -> None:
        """Queue a taken receive for reposting: the same WR (same wr_id, same slot)."""
        again = self._repost.get(qpn)
        if again is None:
            again = self._repost[qpn] = []
        again.append(self._recv_wr[wr_id])
        if len(again) >= REPOST_BATCH:
            self._repost_due = True

    def _post_receives(self, everything: bool) -> None:
        """Post the receives taken since the last time again, per QP in batches of
        :data:`REPOST_BATCH` (a post costs microseconds; :data:`RECV_SLOTS` stay
        ahead of the peer by far), or ``everything``."""
        for qpn, wrs in list(self._repost.items()):
            if len(wrs) < REPOST_BATCH and not everything and qpn in self.qps:
                continue
            del self._repost[qpn]
            qp = self.qps.get(qpn)
            if qp is not None:
                with contextlib.suppress(OSError):
                    qp.post_recv(wrs)
            else:  # a drained QP's last receives (:meth:`_destroy_qp`): slots back to the pool
                for wr in wrs:
                    slot = self._recv_slot.pop(wr.wr_id, None)
                    if slot is not None:
                        self._recv_free.append(slot)
                        self._recv_wr.pop(wr.wr_id, None)

    def _completion(self, wc: WorkCompletion, now: float) -> None:
        engine = self.engine
        status, qpn, wr_id = wc.status, wc.qp_num, wc.wr_id
        if wc.opcode is _RECV:
            slot = self._recv_slot.get(wr_id)
            if status is not _SUCCESS or slot is None:
                if slot is not None:
                    self._recv_free.append(self._recv_slot.pop(wr_id))
                    self._recv_wr.pop(wr_id, None)
                qp = self.qps.get(qpn)
                self.execute(engine.link_failed(qpn, f"receive {status.name}", now,
                                                peer_gone=qp is not None and qp.peer_gone))
                return
            off = slot * SLOT
            if wc.byte_len <= SLOT:
                self._received(qpn, [self._recv_mr.buf[off : off + wc.byte_len]], now)
            else:
                self._received(qpn, [self._long_message(wc, off)], now)
            self._again(qpn, wr_id)
            return
        if status is not WcStatus.SUCCESS:
            qp = self.qps.get(qpn)
            self.execute(engine.link_failed(qpn, f"send {status.name}", now,
                                            peer_gone=qp is not None and qp.peer_gone))
            return
        self.execute(engine.send_completed(qpn, wr_id, True, now))

    def wait(self, hc: HostConn, ready: Callable[[], bool], deadline: float | None,
             spin: float = SPIN) -> bool:
        """Block until ``ready()`` (lock held); polls the CQ itself when it can (module doc).

        :param spin: seconds to watch the CQ before sleeping (:data:`SPIN`); 0 for a wait
            that the CQ does not end first (a CLC message comes over TCP).
        :returns: ``ready()`` at the end (False on timeout).
        """
        polled = False
        while not ready():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if polled:
                    self._hand_back()
                return False
            if self._poller == "app":
                hc.waiters += 1
                try:
                    hc.cond.wait(left if left is not None else 1.0)
                finally:
                    hc.waiters -= 1
                continue
            self._app_poll(left, spin)
            polled = True
        if polled:
            self._hand_back()
        return True

    def poll_until(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Poll for the runtime until ``ready()`` or ``deadline`` (lock held), as
        :meth:`wait` does, for a thread that waits for news of no one connection (an
        accept queue's ``accept``: the handshakes' CLC messages are read, and their
        outcomes delivered, in the thread that will take them, not handed over from
        another).  Does nothing while another application thread polls (the caller
        then waits its own way: that poller delivers the news as before), nor once the
        runtime is closing (at exit, under a daemon thread that waits in ``accept``).

        :returns: whether this thread polled (the caller looks at its state again).
        """
        polled = False
        while not ready() and self._poller != "app" and self._running:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            self._app_poll(left)
            polled = True
        if polled:
            self._hand_back()
        return polled

    def _app_poll(self, left: float | None, spin: float = 0.0) -> None:
        """One round of an application thread polling the CQ for everyone (lock held;
        :meth:`wait`, :meth:`poll_until`): it is the poller meanwhile, and others stand by."""
        self._poller = "app"
        self._poller_ident = threading.get_ident()
        try:
            self._sleep_on_cq(left, spin)
        finally:
            self._poller = None
            self._app_polled = time.monotonic()

    def _hand_back(self) -> None:
        """An application thread stops polling (lock held): handshakes under way (a
        connect given up at its timeout, an accept queue's others) are the progress
        thread's to watch now, at once rather than at its next look (:data:`STANDBY`)."""
        if self._clc_watch and self._poller is None:
            self._wake_progress()

    def _sleep_on_cq(self, left: float | None, spin: float = 0.0) -> None:
        """Sleep on the CQ descriptor (lock released) until news or the next deadline.

        :param spin: seconds to poll the CQ first (lock released) before arming it
            and sleeping (see :data:`SPIN`).
        """
        wcs = self.cq.poll(64)  # look first: arm (and pay for the rings it asks for) only to sleep
        if not wcs and spin > 0.0:
            wcs = self._spin(spin if left is None else min(spin, left))
        if not wcs:
            self.cq.req_notify()  # arm, then look again: a completion after this look rings
            wcs = self.cq.poll(64)
        if not wcs:
            timer = self.engine.get_timer()
            limit = 1.0 if left is None else left
            if timer is not None:
                limit = min(limit, max(0.0, timer - time.monotonic()))
                if limit == 0.0:
                    self._timer_check = 0.0  # due now: process() must run the timers
            fds = [self.cq.fileno(), self._bell_r.fileno(), self._clc_ep.fileno(),
                   *self._tcp_watch]  # fmt: skip
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)
            self.lock.release()
            try:
                r = [fd for fd, _ in poller.poll(limit * 1000)]
            finally:
                self.lock.acquire()
            for fd in r:
                if fd == fds[2]:
                    for clc_fd, _ in self._clc_ep.poll(0):
                        hc = self._clc_watch.get(clc_fd)
                        if hc is not None:
                            self._clc_read(hc)
                elif (hc := self._tcp_watch.pop(fd, None)) is not None:
                    self._tcp_ended(hc)
                elif fd == fds[0]:
                    self.cq.clear_signal()
                elif fd == fds[1]:  # our own doorbell (non-blocking)
                    with contextlib.suppress(OSError):
                        os.read(fd, 4096)
                    if self._poller == "app" and self._poller_ident != threading.get_ident():
                        # an app thread took over polling while we slept: the ring (a new
                        # descriptor to watch) was for it, and it may have gone into its
                        # poll just after we drained the bell
                        self.kick()
        self.process(wcs)

    def _spin(self, seconds: float) -> list[WorkCompletion]:
        """Watch the CQ for up to ``seconds`` with the lock released, then take what came
        (lock held again: completions are handled in order by whoever holds it).

        Each empty look yields the CPU (``sched_yield``, GIL released): a peer
        process or thread that is runnable on this core runs at once instead of
        waiting for the spin to end -- on a host with fewer free cores than
        busy threads a spinning waiter would otherwise delay the very answer it
        waits for; on an idle core the yield returns at once.
        """
        news, clock, yield_cpu = self.cq.has_completions, time.monotonic, os.sched_yield
        until = clock() + seconds
        self.lock.release()
        try:
            while not news() and clock() < until:
                yield_cpu()
        finally:
            self.lock.acquire()
        return self.cq.poll(64)

    def wake_poller(self) -> None:
        """:meth:`kick`, unless the calling thread is the application thread that polls
        (it looks again when its poll returns; a ring would cost it a wasted round)."""
        if self._poller != "app" or self._poller_ident != threading.get_ident():
            self.kick()

    def kick(self) -> None:
        """Wake a sleeping poller (to re-check for a new deadline).

        Never blocks: a full doorbell (kicks faster than a poller drains them) already
        wakes the poller.  Blocking there, the kicker held the runtime's lock while the
        poller that would drain the bell waited for that lock: every thread of the
        process stopped (asyncio's test_ssl, TLS over TLS with ten client threads)."""
        with contextlib.suppress(OSError):
            self._bell_w.send(b"k", _DONTWAIT)

    def _progress_thread(self) -> None:
        """Own progress while no application thread waits; stand by while one does.

        An application poller hands the CQ back without waking this thread (that
        would cost a wakeup per message); this thread looks every
        :data:`STANDBY` seconds instead and sleeps on the CQ again only when no
        application thread polled for that long.
        """
        with self.lock:
            while self._running:
                try:
                    self._progress_step()
                except Exception:  # a bug must not stop progress for every connection
                    traceback.print_exc(file=sys.stderr)
                    self._standby()  # (and must not spin if it persists)

    def _progress_step(self) -> None:
        """One round of :meth:`_progress_thread` (lock held)."""
        if self._orphans or self._draining:
            self._reap_orphans()
        # (handshakes under way need their TCP sockets watched: an app thread that
        # polls watches them too, a standing-by progress thread would not)
        if self._corked:  # (corked bytes wait for a CDC: someone must take it promptly)
            self._corked = any(c.tx_app > c.tx_sent for c in self.engine.conns.values())
        if self._standing_by():
            self._standby()
            self.process()
            return
        self._set_poller("bg")
        try:
            self._sleep_on_cq(STANDBY if self._draining else None)
        finally:
            if self._poller == "bg":
                self._poller = None

    def _standing_by(self) -> bool:
        """Whether the progress thread leaves the CQ to an application thread: one polls,
        or polled within :data:`STANDBY`, and no handshake or corked bytes need watching."""
        return self._poller == "app" or (time.monotonic() - self._app_polled < STANDBY
                                          and not self._clc_watch and not self._corked)  # fmt: skip

    def _standby(self) -> None:
        """The progress thread stands by (lock held on entry and on return): it lets go
        of the lock and asks for it again only after :data:`STANDBY` in which no
        application thread polled, or when woken (:meth:`_wake_progress`).

        Why not wait on a condition of the lock: its wait takes the lock back at each
        timeout, and an application thread that polls releases and takes the lock at
        every message; the waiter then sleeps and wakes once per release, losing the
        race each time (measured: 10 000 context switches a second, a streaming RoCE
        sender's every message, 64 KiB writes)."""
        self.lock.release()
        try:
            while True:
                woken = self._bg_wake.wait(STANDBY)
                self._bg_wake.clear()
                # (read without the lock: a stale look only costs one more round; orphans
                # and closes that drain are looked at every STANDBY, _progress_step)
                if (woken or not self._running or self._orphans or self._draining
                        or not self._standing_by()):  # fmt: skip
                    return
        finally:
            self.lock.acquire()

    def _wake_progress(self) -> None:
        """End the progress thread's standby (:meth:`_standby`) now: there is work an
        application thread that polls would not do (lock held or not)."""
        self._bg_wake.set()

    def _set_poller(self, who: str) -> None:
        """A method, not an assignment in place: mypyc would take the attribute for the
        narrowed ``str`` in the ``finally`` after it, where another thread may have reset
        it to None meanwhile (the lock is released while polling): TypeError."""
        self._poller = who

    def close(self) -> None:
        """Stop the thread and release the device (at exit; a second call does nothing).

        First the peers are told (:meth:`_end_links`), unless this is a forked child's
        copy of its parent's runtime (the parent's links are not the child's to end).
        """
        if not self._running:
            return
        if self._port_watcher is not None:
            self._port_watcher.close()
        if self.pid == os.getpid():
            self._end_links(time.monotonic() + EXIT_LINGER)
        self._running = False
        self.kick()
        self._wake_progress()
        self._progress.join(timeout=2.0)
        with self.lock:
            for qp in list(self.qps.values()):
                qp.destroy()
            self.qps.clear()
        for res in self.ports:
            res.device.close()
        if not self._progress.is_alive():  # (a thread still in poll keeps its doorbell)
            self._bell_r.close()
            self._bell_w.close()
            self._clc_ep.close()

    def close_at_exit(self) -> None:
        """:meth:`close` at the interpreter's exit (``atexit``).

        Threads still in ``recv`` or ``send`` then are daemon threads (Python joins
        the others before ``atexit``), which TCP leaves blocked until the process is
        gone; :attr:`exiting` tells the socket layer to leave them blocked too, rather
        than have each report the links' end in a traceback as the program exits.
        """
        self.exiting = True
        self.close()

    def _end_links(self, deadline: float) -> None:
        """Before the RNIC goes: closes under way finish (the progress thread carries
        them: the peer's last CDCs are received and acknowledged, DELETE RKEY flows
        answered) until ``deadline``; then every link group ends with DELETE LINK
        (:meth:`Engine.shutdown`), the links kept until the peer's DELETE LINK has come
        (Linux sends one back) or :data:`EXIT_DELETE_WAIT` is over.  Corked bytes go
        first (:meth:`uncork`): the peer's answer that would send them may come after
        the links have ended, and they would be lost."""
        with self.lock:
            self.uncork()
        done = False  # (no `break` inside `with`: mypyc does not compile it)
        while not done:
            with self.lock:
                done = (not (self.engine.closing() or self._draining or self._orphans)
                        or time.monotonic() >= deadline)  # fmt: skip
                if done:
                    self.execute(self.engine.shutdown(time.monotonic()))
            if not done:
                self.kick()
                time.sleep(0.005)
        answered = time.monotonic() + EXIT_DELETE_WAIT
        while True:  # the peers' DELETE LINKs, received and acknowledged
            with self.lock:
                if not self.engine.ending() or time.monotonic() >= answered:
                    self.execute(self.engine.shutdown(time.monotonic(), final=True))
                    return
            self.kick()
            time.sleep(0.005)


_SEND = WrOpcode.SEND
_SOLICITED = SendFlag.SOLICITED
_RECV, _SUCCESS = WcOpcode.RECV, WcStatus.SUCCESS
_WRITE = WrOpcode.RDMA_WRITE


def ring_write(ring: memoryview, pos: int, data: memoryview) -> None:
    """Copy ``data`` into the ring buffer ``ring`` at cursor ``pos`` (absolute: taken
    modulo the ring's size), wrapping around its end: a send buffer's bytes."""
    size, n = len(ring), len(data)
    start = pos % size
    if start + n <= size:
        ring[start : start + n] = data
    else:
        first = size - start
        ring[start:] = data[:first]
        ring[: n - first] = data[first:]


def ring_read(ring: memoryview, pos: int, out: memoryview) -> None:
    """Fill ``out`` from the ring buffer ``ring`` at cursor ``pos`` (absolute), wrapping
    around its end: an RMBE's bytes."""
    size, n = len(ring), len(out)
    start = pos % size
    if start + n <= size:
        out[:] = ring[start : start + n]
    else:
        first = size - start
        out[:first] = ring[start:]
        out[first:] = ring[: n - first]


def _write_wrs(writes: list[tuple[int, int, memoryview]]) -> list[SendWr]:
    """Inline RDMA WRITE WRs for ``(remote_addr, rkey, data)`` (writes no CDC followed)."""
    return [SendWr(wr_id=0, opcode=_WRITE, remote_addr=addr, rkey=rkey,
                   send_flags=SendFlag.INLINE, inline_data=data)
            for addr, rkey, data in writes]  # fmt: skip


_stacks: dict[str, Stack] = {}
_stack_lock = threading.Lock()
on_new_stack: list[Callable[[Stack], None]] = []
"""Called with each runtime made (``smcr trace`` hooks the runtimes of a traced process)."""


def default_buffer_size(kind: str | None = None) -> int:
    """The send buffer and RMB size of a connection without SO_SNDBUF/SO_RCVBUF:
    :data:`BUFFER` on the shm RNIC, :data:`ROCE_BUFFER` on RoCE.

    :param kind: ``"shm"`` or ``"roce"``; default the current ``SMCR_RNIC``'s.
    """
    kind = kind or devices.rnic_kind()
    return ROCE_BUFFER if kind == "roce" else BUFFER


def autocork_size(kind: str) -> int:
    """The autocorking size (:attr:`Config.autocork_size`) of a runtime on RNIC ``kind``:
    ``SMCR_AUTOCORK`` bytes (0 turns it off), default :data:`AUTOCORK` on the shm RNIC and
    off on RoCE (not measured there yet: each answer costs a SEND and its ACK)."""
    return settings.AUTOCORK.value(AUTOCORK if kind == "shm" else 0)


def testlink_time() -> float:
    """The TEST LINK keepalive interval, seconds: ``SMCR_TESTLINK_TIME`` (as Linux's sysctl
    ``net.smc.smcr_testlink_time``: 0 turns the keepalive off), default 30.

    :raises SettingError: for a value that is not a number of seconds >= 0.
    """
    return settings.TESTLINK_TIME.value(Config().testlink_time)


def max_links() -> int:
    """The most links per link group smcr offers in SMC-Rv2.1: ``SMCR_MAX_LINKS`` (as Linux's
    sysctl ``net.smc.smcr_max_links_per_lgr``: 1 or 2), default 1 (:class:`Config`).  With
    2 smcr takes part in ADD LINK even with one RNIC, as Linux: a Linux peer offers a
    second link at first contact; smcr rejects it when it would be the same path twice
    (both ends one RNIC) and accepts an offer over another RNIC of the peer's, its own
    side asymmetric (the interop suite sees both live).

    :raises SettingError: for anything but 1 or 2 (Linux's range).
    """
    return settings.MAX_LINKS.value(Config().max_links_v2)


def get_stack(local_ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None,
              scope_id: int = 0) -> Stack:  # fmt: skip
    """The runtime of the RNIC a connection uses, made on first use (again in a forked child).

    ``SMCR_RNIC=shm`` (default): one runtime per process on its shm RNIC, whatever
    ``local_ip``.  ``SMCR_RNIC=roce``: one runtime per RoCE RNIC, the one of the
    TCP connection's local address (:mod:`smcr.stack.devices`) -- with a
    link-local IPv6 address, on the interface ``scope_id`` names; without an
    address, the default RNIC's.

    :raises SettingError: for a value of an ``SMCR_*`` variable that is not allowed
        (:data:`smcr.settings.RUNTIME`), e.g. an unknown ``SMCR_RNIC``.
    """
    settings.check(settings.RUNTIME)
    kind = devices.rnic_kind()
    key = "shm" if kind == "shm" else "roce:" + devices.roce_key(local_ip, scope_id)
    with _stack_lock:
        stack = _stacks.get(key)
        if stack is None or stack.pid != os.getpid():
            if stack is not None:  # a forked child: the parent's stacks are not ours
                _stacks.clear()
            device, more = _open_rnics(kind, key)
            size = default_buffer_size(kind)
            config = Config(sndbuf_size=size, rmb_size=size, testlink_time=testlink_time(),
                            autocork_size=autocork_size(kind),
                            max_links_v2=max_links())  # fmt: skip
            stack = _stacks[key] = Stack(config, device=device, more_devices=more)
            if any(isinstance(d, RoceDevice) for d in more):
                stack.watch_ports()
            atexit.register(stack.close_at_exit)
            for hook in list(on_new_stack):
                hook(stack)
        return stack


def _open_rnics(kind: str, key: str) -> tuple[Device | None, list[Device]]:
    """The RNICs of a new runtime: the first (None: a new shm RNIC) and the others
    (:mod:`smcr.stack.ports`: ``SMCR_SHM_RNICS``, ``SMCR_ROCE_DEVS``)."""
    if kind == "shm":
        pid = os.getpid()
        return None, [ShmDevice(f"smcr{pid}_{i}") for i in range(1, ports.shm_rnics())]
    first = devices.open_roce(key.split(":", 1)[1])
    try:
        return first, list(ports.roce_more(first))
    except BaseException:
        first.close()
        raise


def process_stacks() -> list[Stack]:
    """This process's runtimes (not those a forked child inherited from its parent)."""
    with _stack_lock:
        return [s for s in _stacks.values() if s.pid == os.getpid()]


def close_stacks() -> None:
    """Close every runtime of this process (tests that tear down the RNICs' namespaces)."""
    with _stack_lock:
        stacks = [s for s in _stacks.values() if s.pid == os.getpid()]
        _stacks.clear()
    for stack in stacks:
        stack.close()

