"""The runtime: one engine, one RNIC and one progress thread per RNIC in use.

:class:`Stack` wires the runtime's parts, each with one concern, as Linux splits
``smc_wr``/``smc_tx``/``smc_rx``/``smc_close``:

==========================================  ==============================================
:mod:`~smcr.stack.hostconn`                 the records: a connection, an RNIC, the tap
:mod:`~smcr.stack.readiness`                the readiness descriptor of an SMC-R socket
:mod:`~smcr.stack.bufpool`                  RMBs and send buffers, reused with their rkey
:mod:`~smcr.stack.wrslots`                  receive and send slots, posting WRs
:mod:`~smcr.stack.qps`                      QPs made, brought up and torn down
:mod:`~smcr.stack.wakeup`                   who polls the CQ now; the doorbells
:mod:`~smcr.stack.clcwatch`                 the TCP sockets watched (CLC, peers' ends)
:mod:`~smcr.stack.executor`                 engine actions -> verbs; completions -> engine
:mod:`~smcr.stack.closing`                  closes finished in the background, orphans
:mod:`~smcr.stack.progress`                 waiting, polling, the progress thread
:mod:`~smcr.stack.ports`                    more RNICs, and the watcher of their state
:mod:`~smcr.stack.conn`                     one connection's data path (above the runtime)
==========================================  ==============================================

Design (the why of each):

* **The RNIC is chosen per connection** (:func:`get_stack`,
  :mod:`smcr.stack.devices`): the shm RNIC (one per process, the default), or
  with ``SMCR_RNIC=roce`` the RoCE RNIC of the TCP connection's local address.
  Everything above the verbs is the same for both.
* **Further RNICs are ports of the same engine** (``more_devices``,
  :mod:`smcr.stack.ports`): a link group then has a link over each (ADD LINK), every
  RMB registered on each (:meth:`EngineHost.register_rmb
  <smcr.stack.provider.EngineHost.register_rmb>`), one CQ for all their QPs
  (:class:`~smcr.stack.hostconn.PortRes`).  An RNIC that fails (:meth:`Stack.port_down`:
  its net device, or an injected failure) has its links failed over by the engine;
  when it is back (:meth:`Stack.port_up`) a link is added again.
* **One lock serialises the engine** (STYLE §9): application threads and the
  progress thread call the engine only while holding :attr:`Stack.lock`.
* **Progress does not depend on the application, and whoever waits, polls**
  (:mod:`smcr.stack.progress`).
* **The data path is fused where the RNIC allows** (shm: inline WRs): a send
  with nothing waiting goes from the caller's buffer straight into the peer's
  RMBE with its CDC in one call (:meth:`Executor.send_inline`), flushes from the
  send buffer and CDCs go the same way (``QueuePair.post_writes_send``), and
  receives are reposted in batches.  What is left per message is Python work;
  ``smcr bench`` shows its CPU time per message.
* **Buffers are pooled** (:mod:`smcr.stack.bufpool`): a released connection's RMB and
  send buffer go back when the engine says the peer can no longer write into the RMB
  (:class:`~smcr.core.ReuseRmb`, Linux ``smcr_buf_unuse``): at once after an orderly
  close, where the group keeps the RMB announced and its next connection that gets it
  needs no CONFIRM RKEY (:meth:`Engine.release <smcr.core.engine.Engine.release>`);
  otherwise once the peer has answered the DELETE RKEY of the RMB: a write it posted
  before arrives before that answer, never in the next connection's bytes.
* **Orphans**: a socket collected unclosed hands its connection over without the lock
  (:meth:`Stack.orphan`); the progress thread drains its send buffer and closes it, as
  the kernel finishes a closed socket's work (:mod:`smcr.stack.closing`).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from smcr import exits, settings
from smcr.bound import monotonic
from smcr.core import Action, Config, Engine, LocalIdentity, NextHop, Port, Rmb
from smcr.core.connection import Connection
from smcr.pnet import Entry, PnetTable, lookup
from smcr.rdma import WorkCompletion
from smcr.rdma.base import Device, ProtectionDomain, QueuePair
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.shm import ShmDevice
from smcr.stack import devices, ports
from smcr.stack.bufpool import BufferPool
from smcr.stack.clcwatch import ClcWatch
from smcr.stack.closing import EXIT_LINGER, Closing
from smcr.stack.executor import Executor
from smcr.stack.hostconn import HostConn, PortRes, StackTap, Taps
from smcr.stack.progress import SPIN, Progress
from smcr.stack.readiness import Readiness
from smcr.stack.wakeup import Wakeups
from smcr.stack.wrslots import WorkRequests
from smcr.ueid import UeidTable
from smcr.wire.clc import make_hostname

TESTLINK_ENV = "SMCR_TESTLINK_TIME"
MAX_LINKS_ENV = "SMCR_MAX_LINKS"
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
# The verbs RNIC's default: 512 KiB.  Why smaller: a device pins every page of an MR for
# as long as it is registered, so the lazily backed mappings of the other RNICs cost
# their whole size here (a 1 GiB host with 4 MiB buffers would hold ~100 connections).
VERBS_BUFFER = 512 << 10
AUTOCORK = 64 << 10
"""Autocorking size on the shm RNIC (Linux's ``autocorking_size`` default; see
:attr:`Config.autocork_size`): 1 KiB writes in a stream go as one CDC per batch."""


class Stack:
    """The per-process runtime (module docstring): its parts, wired."""

    def __init__(self, config: Config | None = None, max_buffers: int = 1 << 16,
                 device: Device | None = None,
                 more_devices: Sequence[Device] = (),
                 pnet_table: PnetTable | None = None) -> None:  # fmt: skip
        """:param device: the RNIC (default: a new shm RNIC); see :func:`get_stack`.
        :param more_devices: further RNICs of the same kind (ports 1, 2...): links of a
            group go over them too (:mod:`smcr.stack.ports`); the runtime owns them.
        :param pnet_table: where the RNICs' PNET IDs come from (default: the host's,
            :mod:`smcr.pnet`)."""
        config = config if config is not None else Config(sndbuf_size=BUFFER, rmb_size=BUFFER)
        self.pid = os.getpid()
        self.device = device if device is not None else ShmDevice(f"smcr{self.pid}")
        all_devices = [self.device, *more_devices]
        mtu = min(int(d.attr.active_mtu) for d in all_devices)
        if mtu < config.qp_mtu:  # CLC announces what this RNIC's port can carry
            config = replace(config, qp_mtu=mtu)
        if more_devices or config.max_links_v2 >= 2:
            # a second RNIC, or two links asked for (SMCR_MAX_LINKS): ADD LINK as Linux,
            # which with one RNIC offers an asymmetric link over it, and accepts a
            # peer's offer over another RNIC of the peer's
            config = replace(config, add_links=True)
        self.config = config
        self.pd: ProtectionDomain = self.device.alloc_pd()
        self.cq: CompletionQueue = self.device.create_cq(1 << 20)
        self.wr = WorkRequests(self.pd)
        self.ports = [PortRes(self.device, self.pd, self.wr.recv_mr, self.wr.send_mr)]
        """The runtime's RNICs by port (index into the engine's ``identity.ports``)."""
        for dev in more_devices:
            pd = dev.alloc_pd()  # the same slot buffers, registered on each RNIC
            self.ports.append(PortRes(dev, pd, *self.wr.register_on(pd)))
        self.taps = Taps()
        self.taps.host = self
        self.pool = BufferPool(self.pd, max_buffers)
        self.wake = Wakeups()
        mac = self.device.mac
        identity = LocalIdentity(self.device.gid, mac, secrets.token_bytes(2) + mac,
                                 hostname=make_hostname(socket.gethostname()),
                                 v2_over_ipv6=devices.v2_over_ipv6(self.device),
                                 netdev=self.device.netdev or self.device.name,
                                 more_ports=tuple(Port(d.gid, d.mac, d.netdev or d.name)
                                                  for d in more_devices))  # fmt: skip
        self.ex = Executor(config, identity, self.ports, self.cq, self.pool, self.wr,
                           self.wake, ClcWatch(not isinstance(self.device, ShmDevice)),
                           self.taps, min(d.attr.max_inline_data for d in all_devices))  # fmt: skip
        self.closing = Closing(self.ex, self.pid)
        self.progress = Progress(self.ex, self.closing)
        self._ueids = UeidTable()
        """The host's UEIDs (:mod:`smcr.ueid`), handed to the engine at each handshake."""
        self._pnet = pnet_table if pnet_table is not None else PnetTable()
        self._pnet_seen: tuple[Entry, ...] | None = None
        self._apply_pnet()
        self._port_watcher: ports.PortWatcher | None = None
        self._running = True
        self.exiting = False
        """The interpreter is exiting (:meth:`close_at_exit`)."""
        self.progress.start()

    # ================================================================ the parts' state

    @property
    def lock(self) -> threading.Lock:
        """The one lock of the runtime (module docstring)."""
        return self.ex.lock

    @property
    def engine(self) -> Engine:
        """The SMC-R engine."""
        return self.ex.engine

    @property
    def qps(self) -> dict[int, QueuePair]:
        """The QPs by number."""
        return self.ex.qps

    @property
    def conns(self) -> dict[int, HostConn]:
        """The connections by id, from handshake to release."""
        return self.ex.conns

    @property
    def max_inline(self) -> int:
        """Inline WRITE limit of this RNIC's QPs: a send this small skips the send buffer."""
        return self.ex.max_inline

    @property
    def stats(self) -> dict[str, int]:
        """Handshake outcomes: ``smc``, ``fallback``, ``handshake_errors``."""
        return self.ex.stats

    @property
    def fallback_reasons(self) -> Counter[tuple[int, int]]:
        """(local, peer) decline code -> count (Linux ``smc_stats`` fallback reasons)."""
        return self.ex.fallback_reasons

    @property
    def tap(self) -> StackTap | None:
        """What watches this runtime's link traffic (:class:`StackTap`), or None."""
        return self.taps.tap

    @tap.setter
    def tap(self, tap: StackTap | None) -> None:
        self.taps.tap = tap

    # ================================================================ ports

    def port_of(self, qpn: int) -> int:
        """The port (RNIC) a QP of this runtime is on."""
        return self.ex.qp.port_of(qpn)

    def reaches(self, port: int, gid: bytes) -> bool:
        """Whether our ``port`` has a path to a peer port's GID (:meth:`EngineHost.reaches
        <smcr.stack.provider.EngineHost.reaches>`)."""
        return self.ex.host.reaches(port, gid)

    def find_route(self, port: int, gid: bytes) -> NextHop | None:
        """How our ``port`` reaches a peer's GID (:meth:`EngineHost.find_route
        <smcr.stack.provider.EngineHost.find_route>`)."""
        return self.ex.host.find_route(port, gid)

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
        qpns = [q for q in self.ex.qps if self.port_of(q) == port]
        self.ex.execute(self.engine.port_down(port, reason, monotonic()))
        self.ex.link_failed_all(qpns, f"port {port} down: {reason}")

    def watch_ports(self) -> None:
        """Follow the RoCE ports' net devices (:class:`smcr.stack.ports.PortWatcher`) until
        :meth:`close`."""
        if self._port_watcher is None:
            self._port_watcher = ports.PortWatcher(self)
            self.ex.port_check = self.check_port_of

    def check_port_of(self, qpn: int) -> None:
        """A completion of QP ``qpn`` failed (lock held): if its port's net device is down
        now, the port goes down first (:meth:`port_down`; :attr:`Executor.port_check`), so
        that the engine does not pick it for a new link (an RNIC in the kernel flushes its
        QPs before netlink tells the port watcher)."""
        watcher = self._port_watcher
        port = self.port_of(qpn)
        if watcher is None or port >= len(self.ports) or not self.ports[port].up:
            return
        device = self.ports[port].device
        if not isinstance(device, devices.IP_RNICS):
            return
        problem = watcher.problem_of(device)
        if problem is not None:
            self.port_down(port, f"{problem} (seen after a failed completion)")

    def port_up(self, port: int) -> None:
        """An RNIC is back (lock held): groups down to one link add a link over it again
        (the server offers ADD LINK, Linux ``smcr_port_add``)."""
        res = self.ports[port]
        if res.up:
            return
        res.up = True
        self.ex.execute(self.engine.port_up(port, monotonic()))

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
        engine = self.engine
        ident = engine.identity
        if ids != [p.pnetid for p in ident.ports]:
            engine.identity = replace(ident, pnetid=ids[0], more_ports=tuple(
                replace(p, pnetid=x) for p, x in zip(ident.more_ports, ids[1:], strict=True)))

    # ================================================================ connections

    def new_conn(self, tcp: socket.socket) -> HostConn:
        """Register a connection (lock held by the caller)."""
        return self.ex.new_conn(tcp)

    def early_proposal(self, local_ip: ipaddress.IPv4Address | ipaddress.IPv6Address
                       ) -> tuple[bytes, int, bool] | None:  # fmt: skip
        """The Proposal a client's thread may send itself before the rest of the set-up
        (lock held): encoded, the port it names and whether it offers SMC-Rv2, for
        :meth:`start_handshake`'s ``sent``.  The server works on it meanwhile, rather than
        wait for the connection's records, its buffers and its watch to be made (about 50
        us here, on every connection's path).  None where the runtime sends it as before:
        a tap watches the CLC actions, or a handshake of this runtime is under way (the
        other end may be one: :meth:`ClcWatch.sent <smcr.stack.clcwatch.ClcWatch.sent>`
        has it read at once)."""
        if self.taps.tap is not None or self.ex.clc.watch:
            return None
        self._read_tables()
        return self.engine.proposal(devices.prefix_ip(self.device, local_ip))

    def _read_tables(self) -> None:
        """The UEID and PNET tables as they are now, for the handshake starting (Linux reads
        its tables at every handshake)."""
        self.engine.ueids = self._ueids.current()
        self._apply_pnet()

    def start_handshake(self, hc: HostConn, client: bool, local_ip: ipaddress.IPv4Address
                        | ipaddress.IPv6Address, rmb_size: int, sndbuf_size: int,
                        polled: bool = False, sockname: Any = None,
                        sent: tuple[int, bool] | None = None) -> None:  # fmt: skip
        """Reserve buffers and start the CLC handshake (lock held).

        A size of 0 means the default (:attr:`config`, :data:`BUFFER`).

        :param polled: the caller waits for the outcome with :meth:`wait` right after
            (a blocking ``connect``): it polls the TCP socket itself, so no other
            poller is woken for it (a doorbell ring, or the progress thread's wakeup,
            would only cost a thread switch and a wasted poll round).
        :param sockname: the TCP socket's ``getsockname()``, when the caller has it.
        :param sent: a client's Proposal went already (:meth:`early_proposal`: the port it
            names, whether it offers SMC-Rv2).
        """
        ex, engine = self.ex, self.engine
        local_ip = devices.prefix_ip(self.device, local_ip)
        ends = None
        if sockname is not None or not self.pool.grouped:
            try:
                address = hc.tcp.getpeername()
                hc.peer = (client, address[0] if isinstance(address, tuple) else address)
                if sockname is not None:
                    ends = (sockname, address)
            except OSError:
                hc.peer = None
        # shm: the send buffer now, the RMB once the engine has chosen the link group
        # (EngineHost.place_rmb), so the engine is handed only its size here; RoCE: both
        rmb = None
        snd = 0
        rmb_size = rmb_size or self.config.rmb_size
        if self.pool.reserve(hc, sndbuf_size or self.config.sndbuf_size, rmb_size, hc.peer):
            mr = hc.rmb_mr
            rmb = Rmb(0, 0, rmb_size) if mr is None else Rmb(mr.rkey, mr.addr, mr.length)
            snd = hc.sndbuf_mr.length if hc.sndbuf_mr is not None else 0
        now = monotonic()
        if sent is None:  # (read by early_proposal otherwise)
            self._read_tables()
        if client:
            actions = engine.connect(hc.conn_id, rmb, local_ip, now, snd, sent)
        else:
            actions = engine.accept(hc.conn_id, rmb, local_ip, now, snd)
        hc.handshake = engine.handshake(hc.conn_id)
        # watched before anything goes: a client's Proposal is read by a server end of
        # ours before execute returns (ClcWatch.sent), not in another thread's poll; an
        # outcome at once lets it go again (Executor._outcome)
        ex.clc.add(hc, ends, register=client)
        ex.execute(actions)
        if not client:
            try:
                if hc.undecided():  # the client's Proposal is often here already
                    ex.clc_read(hc)
            finally:
                ex.clc.register(hc)  # (after the read: ClcWatch.add)
        if hc.undecided() and not polled and self.wake.poller is None:
            # nobody polls (a thread that does sleeps on the CLC epoll, which has it now):
            # the standing-by progress thread watches it from now on
            self.wake.wake_progress()

    def engine_conn(self, hc: HostConn) -> Connection | None:
        """The engine's connection record (None once released)."""
        return self.ex.engine_conn(hc)

    def engine_conns(self) -> list[Connection]:
        """The engine's records of every connection it holds (lock held)."""
        return list(self.engine.conns.values())

    def local_peer(self, hc: HostConn, c: Connection) -> bool:
        """Whether the connection's other end is in this runtime too
        (:meth:`Executor.local_peer`)."""
        return self.ex.local_peer(hc, c)

    def unwatch_tcp(self, hc: HostConn) -> None:
        """Stop watching a connection's TCP socket (before it is closed; lock held)."""
        self.ex.clc.unwatch_tcp(hc)

    # ================================================================ the data path

    def execute(self, actions: list[Action]) -> None:
        """Run the engine's actions (lock held; :meth:`Executor.execute`)."""
        self.ex.execute(actions)

    def process(self, first: list[WorkCompletion] | None = None) -> None:
        """Take every completion and run due timers (lock held; :meth:`Executor.process`)."""
        self.ex.process(first)

    def send_inline(self, c: Connection, data: memoryview, request: bool = False) -> None:
        """RDMA-write ``data`` inline with its CDC (lock held; :meth:`Executor.send_inline`)."""
        self.ex.send_inline(c, data, request)

    def uncork(self, hc: HostConn | None = None) -> None:
        """Send corked bytes now (lock held; :meth:`Executor.uncork`)."""
        self.ex.uncork(hc)

    def update_readiness(self, hc: HostConn) -> None:
        """Bring the connection's readiness descriptor up to date (lock held)."""
        self.ex.update_readiness(hc)

    def adopt_readiness(self, hc: HostConn, r: Readiness) -> None:
        """``r`` is the connection's readiness descriptor from now on (lock held)."""
        self.ex.adopt_readiness(hc, r)

    def readiness_watched(self) -> None:
        """A connection's readiness descriptor is the program's (lock held): from now on
        news that comes between two polls of its threads is heard at once, the first
        too (:meth:`Progress.standby_needed <smcr.stack.progress.Progress.standby_needed>`)."""
        wake = self.wake
        if not wake.watched:
            wake.watched = True
            if wake.poller is None:
                self.progress.arm_standby()

    def drop_readiness(self, hc: HostConn) -> None:
        """The application closed the connection: its readiness descriptor goes now (lock
        held), not when the close handshake ends, as a closed socket's descriptor is
        gone when ``close()`` returns (``epoll.unregister`` of it fails with EBADF)."""
        if hc.readiness is not None:
            hc.readiness.close()
            hc.readiness = None

    def wait(self, hc: HostConn, ready: Callable[[], bool], deadline: float | None,
             spin: float = SPIN, clc: bool = False) -> bool:
        """Block until ``ready()`` (lock held; :meth:`Progress.wait`)."""
        return self.progress.wait(hc, ready, deadline, spin, clc)

    def poll_until(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Poll for the runtime until ``ready()`` (lock held; :meth:`Progress.poll_until`)."""
        return self.progress.poll_until(ready, deadline)

    def wake_poller(self) -> None:
        """Wake the thread that polls, unless it is the caller (:meth:`Wakeups.wake_poller`)."""
        self.wake.wake_poller()

    def kick(self) -> None:
        """Wake a sleeping poller (:meth:`Wakeups.kick`)."""
        self.wake.kick()

    # ================================================================ closing

    def shutdown_write(self, hc: HostConn) -> None:
        """``shutdown(SHUT_WR)`` (lock held; :meth:`Executor.shutdown_write`)."""
        self.ex.shutdown_write(hc)

    def app_close(self, hc: HostConn) -> None:
        """The application closed the connection (lock held; :meth:`Closing.app_close`)."""
        self.closing.app_close(hc)

    def abort(self, hc: HostConn) -> None:
        """Abortive close (lock held; :meth:`Closing.abort`)."""
        self.closing.abort(hc)

    def close_later(self, hc: HostConn) -> None:
        """Close once the send buffer is out, in the background (lock held;
        :meth:`Closing.close_later`)."""
        self.closing.close_later(hc)

    def orphan(self, hc: HostConn, linger: float | None) -> None:
        """Close a connection whose socket was collected unclosed (any thread, lock-free;
        :meth:`Closing.orphan`)."""
        self.closing.orphan(hc, linger)

    def close(self) -> None:
        """Stop the thread and release the device (at exit; a second call does nothing).

        First the peers are told (:meth:`Closing.end_links`), unless this is a forked
        child's copy of its parent's runtime (the parent's links are not the child's to
        end).
        """
        if not self._running:
            return
        if self._port_watcher is not None:
            self._port_watcher.close()
        if self.pid == os.getpid():
            self.closing.end_links(monotonic() + EXIT_LINGER)
        self._running = self.closing.running = False
        gone = self.progress.stop()
        with self.lock:
            self.ex.qp.destroy_all()
        for res in self.ports:
            res.device.close()
        self.pool.close()
        if gone:  # (a thread still in poll keeps its doorbell)
            self.progress.close()
            self.wake.close()
            self.ex.clc.close()

    def close_at_exit(self) -> None:
        """:meth:`close` at the interpreter's exit (``atexit``), or as a signal ends the
        process (:func:`smcr.exits.on_exit`): its link groups end with DELETE LINK, so no
        peer waits on links nobody answers, as a TCP peer is not left waiting when the
        kernel closes the sockets of a process it ended.

        Threads still in ``recv`` or ``send`` then are daemon threads (Python joins
        the others before ``atexit``), which TCP leaves blocked until the process is
        gone; :attr:`exiting` tells the socket layer to leave them blocked too, rather
        than have each report the links' end in a traceback as the program exits.
        """
        self.exiting = self.progress.exiting = True
        self.close()


_stacks: dict[str, Stack] = {}
_stack_lock = threading.Lock()
on_new_stack: list[Callable[[Stack], None]] = []
"""Called with each runtime made (``smcr trace`` hooks the runtimes of a traced process)."""


def default_buffer_size(kind: str | None = None) -> int:
    """The send buffer and RMB size of a connection without SO_SNDBUF/SO_RCVBUF:
    :data:`BUFFER` on the shm RNIC, :data:`ROCE_BUFFER` on RoCE, :data:`VERBS_BUFFER` on a
    verbs device.

    :param kind: ``"shm"``, ``"roce"`` or ``"verbs"``; default the current ``SMCR_RNIC``'s.
    """
    kind = kind or devices.rnic_kind()
    return {"roce": ROCE_BUFFER, "verbs": VERBS_BUFFER}.get(kind, BUFFER)


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
    kind = devices.rnic_kind()
    key = "shm" if kind == "shm" else f"{kind}:" + devices.roce_key(local_ip, scope_id)
    with _stack_lock:
        stack = _stacks.get(key)
        if stack is None or stack.pid != os.getpid():
            settings.check(settings.RUNTIME)  # (read when a runtime starts, not per socket)
            if stack is not None:  # a forked child: the parent's stacks are not ours
                _stacks.clear()
            device, more = _open_rnics(kind, key)
            size = default_buffer_size(kind)
            config = Config(sndbuf_size=size, rmb_size=size, testlink_time=testlink_time(),
                            autocork_size=autocork_size(kind),
                            max_links_v2=max_links())  # fmt: skip
            stack = _stacks[key] = Stack(config, device=device, more_devices=more)
            if any(isinstance(d, devices.IP_RNICS) for d in more):
                stack.watch_ports()
            exits.on_exit(stack.close_at_exit)  # (SIGTERM too: no peer waits on our links)
            for hook in list(on_new_stack):
                hook(stack)
        return stack


def _open_rnics(kind: str, key: str) -> tuple[Device | None, list[Device]]:
    """The RNICs of a new runtime: the first (None: a new shm RNIC) and the others
    (:mod:`smcr.stack.ports`: ``SMCR_SHM_RNICS``, ``SMCR_ROCE_DEVS``)."""
    if kind == "shm":
        pid = os.getpid()
        return None, [ShmDevice(f"smcr{pid}_{i}") for i in range(1, ports.shm_rnics())]
    address = key.split(":", 1)[1]
    if kind == "verbs":
        return _with_more(devices.open_verbs(address), ports.verbs_more)
    return _with_more(devices.open_roce(address), ports.roce_more)


def _with_more(first: ports.IpRnicT, more: Callable[[ports.IpRnicT], list[ports.IpRnicT]]
               ) -> tuple[Device, list[Device]]:  # fmt: skip
    """``first`` and the RNICs ``more`` adds to it; ``first`` closed again if that fails."""
    try:
        return first, list(more(first))
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

