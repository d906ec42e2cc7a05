"""The executor: what turns the engine's actions into verbs calls and the RNIC's completions
into the engine's inputs (Linux ``smc_wr_tx_send``/``smc_wr_rx_demultiplex`` and the work
``af_smc.c`` does around them).

It owns the engine and what the engine's actions name (connections, QPs, buffers) and is
driven under the runtime's one lock by whoever holds it: an application thread in a call,
or the progress thread (:mod:`smcr.stack.progress`).

* :meth:`Executor.execute` runs actions in order: WRs of one QP are posted together, and
  where the RNIC takes inline WRs (shm) the WRITEs and the CDC behind them go as one fused
  batch (``QueuePair.post_writes_send``); then the engine's events are dispatched
  (handshake outcomes, resets; waiters and readiness descriptors told).  What it posts
  completes in our own CQ (over shm at once, in the posting thread): the outermost
  ``execute`` takes what the CQ holds when it ends, and those completions ring nobody
  meanwhile (``poster_looks``, as :meth:`Executor.send_inline`'s): a poller armed on the
  CQ, an event loop's progress thread, was woken for each closing CDC or cursor update an
  application thread posted, to take that one completion.
* :meth:`Executor.process` takes the CQ's completions (consecutive receives of one QP go to
  the engine together: it coalesces CDCs), reposts receives in batches, runs the engine's
  due timers, and wakes the waiters of the connections the engine touched.
* It feeds the engine the CLC bytes of handshakes under way (:mod:`smcr.stack.clcwatch`);
  what the engine asks synchronously (QPs, RMB registrations, routes) the engine's
  :class:`~smcr.stack.provider.EngineHost` answers.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from smcr import settings
from smcr.bound import monotonic
from smcr.core import (
    Action,
    Config,
    ConnectionReset,
    DestroyQp,
    Engine,
    FellBack,
    HandshakeCompleted,
    HandshakeFailed,
    LinkGroupTerminated,
    LocalIdentity,
    PostSend,
    QpToRtr,
    QpToRts,
    RdmaWrite,
    ReleaseConnection,
    ReuseRmb,
    SendClc,
    ShutdownTcp,
)
from smcr.core.connection import Connection
from smcr.rdma import SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOpcode
from smcr.rdma.completion import TAKEN_IN_PLACE, CompletionQueue
from smcr.stack import inplace, reader
from smcr.stack.bufpool import BufferPool
from smcr.stack.clcwatch import ClcWatch
from smcr.stack.counters import COUNTERS
from smcr.stack.hostconn import HostConn, PortRes, Taps
from smcr.stack.inplace import InPlace
from smcr.stack.provider import EngineHost
from smcr.stack.qps import QueuePairs
from smcr.stack.readiness import DeferredChecks, Readiness
from smcr.stack.trim import IdleTrim
from smcr.stack.wakeup import Wakeups
from smcr.stack.wrslots import SLOT, WorkRequests, write_wrs
from smcr.wire.decline import DeclineCode

_DEBUG: Final = settings.debug()
TIMER_GRAIN: Final = 0.005  # how often process() asks the engine for its next deadline
_RECV: Final = WcOpcode.RECV
FOLLOW: Final = reader.FOLLOW
"""The lane's ``follow`` (:data:`smcr.stack.reader.FOLLOW`), a C static here: the module's
attribute looked up on each readiness update cost a generic getattr."""
_SUCCESS: Final = WcStatus.SUCCESS
_WRITE: Final = WrOpcode.RDMA_WRITE
_OUTCOME_KEY: Final = {HandshakeCompleted: "smc", FellBack: "fallback",
                HandshakeFailed: "handshake_errors"}  # fmt: skip


class Executor:
    """Runs the engine's actions and feeds it completions (module docstring)."""

    def __init__(self, config: Config, identity: LocalIdentity, ports_: list[PortRes],
                 cq: CompletionQueue, pool: BufferPool, wr: WorkRequests, wake: Wakeups,
                 clc: ClcWatch, taps: Taps, max_inline: int) -> None:  # fmt: skip
        self.config = config
        self.lock = threading.Lock()  # not reentrant: a poller releases it once to sleep
        self.ports = ports_
        self.cq = cq
        self.pool = pool
        self.wr = wr
        self.wake = wake
        self.clc = clc
        self.taps = taps
        self.max_inline = max_inline
        """Inline WRITE limit of this RNIC's QPs: a send this small skips the send buffer."""
        self.fused = max_inline >= SLOT  # CDCs go inline, with their WRITEs fused
        self.keep_copy = len(ports_) > 1
        """Inline sends also copy into the send buffer (:meth:`send_inline`)."""
        self.qp = QueuePairs(ports_, cq, wr, taps, max_inline)
        self.qps = self.qp.qps
        self.conns: dict[int, HostConn] = {}
        self.next_conn = 1
        self.retired: dict[int, HostConn] = {}
        """Released connections whose RMB the peer may still write (until :class:`ReuseRmb`)."""
        self.host = EngineHost(ports_, self.qp, pool, self.conns, self.retired)
        self.engine = Engine(config, identity, self.host)
        self.in_place = self.qp.in_place = InPlace(self.engine, taps)
        self.shutdowns: dict[int, HostConn] = {}  # SHUT_WR waiting for the send buffer
        self.corked_any = False
        """Some connection may hold corked bytes (:meth:`corked`)."""
        self.timer_check = 0.0
        self.checks = DeferredChecks()
        self.trim = IdleTrim()  # idle connections' touched memory given back
        self.port_check: Callable[[int], None] | None = None
        """The runtime's look at a QP's port before its failed completion fails the link."""
        """Rings that news taken by another call turned readable, checked later."""
        self._processing, self._look_again = 0, False  # process() depth; look_again() asked
        self.sends_unprocessed = 0  # RoCE sends since DataPath.send_fast last took the news
        self.held: list[tuple[HostConn, HandshakeCompleted]] = []
        """Clients' completed handshakes whose server end, in this runtime too, has not
        ended its own yet (:meth:`_hold`)."""
        self.stats = {"smc": 0, "fallback": 0, "handshake_errors": 0}
        self.fallback_reasons: Counter[tuple[int, int]] = Counter()
        """(local, peer) decline code -> count (Linux ``smc_stats`` fallback reasons)."""

    # ================================================================ connections

    def new_conn(self, tcp: socket.socket) -> HostConn:
        """Register a connection (lock held)."""
        hc = HostConn(self.next_conn, tcp, None)  # (its Condition when one waits: waitable)
        self.next_conn += 1
        self.conns[hc.conn_id] = hc
        return hc

    def engine_conn(self, hc: HostConn) -> Connection | None:
        """The engine's connection record (None once released)."""
        return self.engine.conns.get(hc.conn_id)

    def local_peer(self, hc: HostConn, c: Connection) -> bool:
        """Whether the connection's other end is in this runtime too (its link's peer QP is
        ours).  Its sends and reads then take the completions they made for the other end
        at once (:meth:`process`): the other end's readiness changes before the call
        returns, as a TCP peer's does over loopback (an event loop runs both ends)."""
        local = hc.local_peer
        if local is None:
            links = self.engine.links
            link = links.get(c.qpn)
            peer = links.get(link.peer_qpn) if link is not None else None
            local = hc.local_peer = peer is not None and peer.peer_qpn == c.qpn
        return local

    def local_end(self, armed: int) -> None:
        """After posting for a connection whose other end is in this runtime (lock held):
        the completions taken at once (:meth:`local_peer`).  ``armed``: the caller disarmed
        the CQ before it posted (:meth:`CompletionQueue.take_arm
        <smcr.rdma.completion.CompletionQueue.take_arm>`: the thread asleep on it is not rung
        for what this thread takes itself); it is armed again here, and looked at once more
        for what came meanwhile without a ring."""
        try:
            self.process()
        finally:  # (never left disarmed: its sleeper would hear of nothing more)
            if armed:
                self.cq.req_notify(armed)
                if self.cq.has_news():
                    self.process()

    def execute_to(self, hc: HostConn, actions: list[Action]) -> None:
        """:meth:`execute` of one connection's actions (lock held); a local peer's
        completions taken before returning (:meth:`local_end`, the CQ's arm taken): it sees
        a shutdown or close at once, as over loopback TCP, not at the next look-in."""
        c = self.engine_conn(hc)
        if not actions or c is None or not self.local_peer(hc, c):
            self.execute(actions)
            return
        armed = self.cq.take_arm()
        try:
            self.execute(actions)
        finally:
            self.local_end(armed)

    # ================================================================ actions

    def execute(self, actions: list[Action]) -> None:
        """Run actions in order, then dispatch the engine's events (lock held); the
        outermost one takes the completions of its posts (module doc)."""
        cq = self.cq
        if not actions or cq.poster_looks:  # (an outer execute, or send_inline, looks after)
            self._run(actions)
            return
        cq.poster_looks = True
        try:
            self._run(actions)
        except BaseException:
            cq.ring_held()  # (no look comes from here: whoever sleeps on the CQ takes them)
            raise
        self._posted()

    def _posted(self) -> None:
        """A poster that set ``poster_looks`` is done: it takes what its posts completed."""
        cq = self.cq
        cq.poster_looks = False
        if not cq.idle():
            self.look_again()

    def _run(self, actions: list[Action]) -> None:
        """:meth:`execute`'s work."""
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
        fused = self.fused
        qp_port = self.qp.qp_port
        for a in actions:
            kind = type(a)
            if kind is RdmaWrite or kind is PostSend:
                if (wrs or writes) and a.qpn != wr_qpn:  # type: ignore[union-attr]
                    self.post(wr_qpn, wrs + write_wrs(writes))
                    wrs, writes = [], []
                wr_qpn = a.qpn  # type: ignore[union-attr]
                if isinstance(a, RdmaWrite):
                    hc = self.conns[a.conn]
                    mr = hc.aliases[qp_port[a.qpn]][1] if a.qpn in qp_port else hc.sndbuf_mr
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
                        self.post(wr_qpn, wrs, writes, a)
                        writes = []
                    else:
                        port = qp_port.get(a.qpn)
                        mr = self.wr.send_mr if port is None else self.ports[port].send_mr
                        wrs.append(self.wr.send_wr(a, mr))
            else:
                if wrs or writes:
                    self.post(wr_qpn, wrs + write_wrs(writes))
                    wrs, writes = [], []
                self._control(a)
        if wrs or writes:
            self.post(wr_qpn, wrs + write_wrs(writes))
        self._dispatch_events()
        if self.clc.local:
            feed_local_clc(self)

    def post(self, qpn: int, wrs: list[SendWr], writes: list[tuple[int, int, memoryview]]
             | None = None, cdc: PostSend | None = None) -> None:  # fmt: skip
        """Post WRs on QP ``qpn`` (:meth:`WorkRequests.post`); a post that fails downs the link."""
        qp = self.qps.get(qpn)
        if qp is None:
            return
        error = self.wr.post(qp, wrs, writes or (), cdc)
        if error:
            self.execute(self.engine.link_failed(qpn, error, monotonic()))

    def send_inline(self, c: Connection, data: memoryview, request: bool = False) -> None:
        """The data path (lock held): ``data`` (at most ``c.direct_room()`` bytes, at most
        :attr:`max_inline`) RDMA-written from the caller's buffer, then its CDC, as one
        fused batch (:meth:`Connection.write_inline`, :meth:`QueuePair.post_writes_send`).

        With several links a failover re-sends from the last completed CDC, out of the
        send buffer (:meth:`Connection.switch_cursor`): the bytes are copied there too.

        It may take completions (the CDC's own, and what else the CQ holds then): a caller
        that goes on with ``c`` afterwards checks it again (the peer's close or abort may
        have come meanwhile).

        :param request: the CDC asks the peer to answer (:meth:`Connection.echo_wanted`).
        """
        cq = self.cq
        cq.poster_looks = True  # (a signaled CDC's completion: taken below, ringing nobody)
        try:
            post_inline(self, c, data, request)
        except BaseException:
            cq.ring_held()  # (no look comes from here: whoever sleeps on the CQ takes them)
            raise
        self._posted()
        if self.engine.has_events():
            self._dispatch_events()

    def _control(self, a: Action) -> None:
        tap = self.taps.tap
        if tap is not None:
            tap.control(self.taps.host, a)
        if isinstance(a, SendClc):
            hc = self.conns.get(a.conn)
            if hc is not None:
                try:
                    hc.tcp.sendall(a.data)
                    self.clc.sent(hc)
                except OSError:
                    pass
        elif isinstance(a, QpToRtr):
            link = self.engine.links.get(a.qpn)
            error = self.qp.to_rtr(a, link.psn if link is not None else 0)
            if error:
                self.execute(self.engine.link_failed(a.qpn, error, monotonic(),
                                                     DeclineCode.ERR_RDYLNK))  # fmt: skip
        elif isinstance(a, QpToRts):
            error = self.qp.to_rts(a.qpn)
            if error:
                self.execute(self.engine.link_failed(a.qpn, error, monotonic(),
                                                     DeclineCode.ERR_RDYLNK))  # fmt: skip
        elif isinstance(a, DestroyQp):
            self.qp.destroy(a.qpn, a.qpn in self.engine.late_links)
        elif isinstance(a, ShutdownTcp):
            hc = self.conns.get(a.conn)
            if hc is not None:
                try:
                    hc.tcp.shutdown(a.how)
                except OSError:
                    pass
        elif isinstance(a, ReleaseConnection):
            self._release(a.conn)
        elif isinstance(a, ReuseRmb):
            hc = self.retired.pop(a.conn, None)
            if hc is not None:
                self.pool.give_back(hc)

    def _release(self, conn_id: int) -> None:
        hc = self.conns.pop(conn_id, None)
        if hc is None:
            return
        hc.released = True
        self._wake_waiters(hc)
        self.clc.unwatch_tcp(hc)
        c = self.engine.conns.get(conn_id)
        if c is not None:  # smcr stats: its bytes, which its cursors counted
            COUNTERS.released(c)
        actions = self.engine.release(conn_id, monotonic())
        self.retired[conn_id] = hc  # its buffers go back to the pool at ReuseRmb
        _close_quietly(hc.tcp)
        if hc.readiness is not None:
            hc.readiness.close()
        self.execute(actions)

    def let_go(self, hc: HostConn) -> None:
        """After the application's close: a connection the engine has forgotten goes."""
        if self.engine_conn(hc) is None and not hc.released:
            hc.released = True
            self.conns.pop(hc.conn_id, None)
            self._wake_waiters(hc)
            self.clc.unwatch_tcp(hc)
            _close_quietly(hc.tcp)

    @staticmethod
    def _wake_waiters(hc: HostConn) -> None:
        """Wake the threads that wait for news of ``hc`` (lock held; only when someone
        listens).  A connection that leaves :attr:`conns` wakes them too: :meth:`process`
        wakes those of connections still there, and a ``close`` that waits for its closing
        CDC, while another thread polls and the peer's close releases the connection in
        the same round, would otherwise sleep out its whole wait (2 s per close when a
        threaded client and gunicorn's workers close at once)."""
        cond = hc.cond
        if hc.waiters and cond is not None:  # (a waiter made it)
            cond.notify_all()

    def _dispatch_events(self) -> None:
        while (ev := self.engine.next_event()) is not None:
            if _DEBUG:
                print(f"smcr[{os.getpid()}] {ev}", flush=True)
            hc = self.conns.get(getattr(ev, "conn", -1))
            if hc is None:
                if isinstance(ev, LinkGroupTerminated):
                    self.pool.group_ended(ev.lgr_id)
                continue
            if isinstance(ev, HandshakeCompleted) and self._hold(hc):
                self.held.append((hc, ev))
                continue
            if isinstance(ev, (HandshakeCompleted, FellBack, HandshakeFailed)):
                self._outcome(hc, ev)
            elif isinstance(ev, ConnectionReset):
                hc.reset_reason = ev.reason
            self._tell(hc)
        if self.held:
            self._release_held()

    def _tell(self, hc: HostConn) -> None:
        """Wake the connection's waiters and bring its readiness descriptor up to date."""
        self._wake_waiters(hc)
        self.update_readiness(hc)

    def _hold(self, hc: HostConn) -> bool:
        """Whether a client's completed handshake waits for its server end's: both ends in
        this runtime, and the server's handshake still running (the CLC Confirm or the
        CONFIRM LINK response is on its way to it).

        Why: over TCP a listener is readable when the client's connect completes, so an
        event loop that runs both ends accepts in the same round as it learns the
        connect is done.  Told first, a client that wrote and aborted at once had its
        connection gone before the server's loop had seen it (Twisted's abort tests)."""
        ends = hc.ends
        if ends is None or hc.handshake is None or not hc.handshake.client:
            return False
        server = self.clc.ends.get((ends[1], ends[0]))
        return (server is not None and server is not hc and server.undecided()
                and self.conns.get(server.conn_id) is server)  # fmt: skip

    def _release_held(self) -> None:
        """Tell the held clients whose server end has an outcome now (or is gone)."""
        held, self.held = self.held, []
        for hc, ev in held:
            if self._hold(hc):
                self.held.append((hc, ev))
            elif hc.undecided():
                self._outcome(hc, ev)
                self._tell(hc)

    def _outcome(self, hc: HostConn, ev: Any) -> None:
        """A handshake ended: SMC-R, a fallback, or a failure."""
        hc.outcome = ev
        self.clc.remove(hc)
        if self.wake.app_polls_elsewhere():
            self.wake.kick()  # the waiting app thread sleeps on the CQ, not on hc.cond
        self.stats[_OUTCOME_KEY[type(ev)]] += 1
        if isinstance(ev, FellBack):
            self.fallback_reasons[(ev.local_code, ev.peer_code)] += 1
        if not isinstance(ev, HandshakeCompleted):
            self.pool.give_back(hc)
            self.conns.pop(hc.conn_id, None)
        elif self.clc.watch_tcp:
            self.clc.watch_end(hc)
        if hc.on_outcome is not None:
            try:
                hc.on_outcome(hc)
            except Exception:  # the socket layer's; progress must go on for all
                traceback.print_exc(file=sys.stderr)

    def update_readiness(self, hc: HostConn) -> None:
        """Bring the connection's readiness descriptor up to date (if anyone asked for it)."""
        r = hc.readiness
        if r is None:
            return
        c = self.engine.conns.get(hc.conn_id)
        follow = FOLLOW  # (its common case in C: the lane's follow)
        looks = follow(r, c) if follow is not None else -1
        if looks < 0:
            looks = int(r.follow(c))
        if looks:
            self.look_again()

    def look_again(self) -> None:
        """Take what the CQ holds now, or when the :meth:`process` under way ends (lock held)."""
        self._look_again = bool(self._processing)
        if not self._processing and self.cq.has_news():
            self.process()

    def adopt_readiness(self, hc: HostConn, r: Readiness | None = None) -> Readiness:
        """The connection's readiness descriptor: ``r``, or a new one, with a bell if it can."""
        c = self.engine.conns.get(hc.conn_id)
        remote = c is not None and not self.local_peer(hc, c)
        token = c.token if c and remote and self.cq.rings_by_name() else 0
        # named where the other end is another process's (one descriptor, and a bell where
        # the RNIC has them); a socket pair where it is ours (readiness.py: an event loop
        # running both ends may os.sendfile to the number)
        hc.readiness = r = r or Readiness(named=remote)
        r.attach(self.cq, token, self.checks)
        self.update_readiness(hc)
        return r

    # ================================================================ completions

    def process(self, first: list[WorkCompletion] | None = None) -> None:
        """Take every completion, run due timers, wake touched waiters (lock held; look_again)."""
        self._processing += 1
        try:
            self._process(first)
            while self._look_again and self._processing == 1:
                self._look_again = False
                self._process(None)
        finally:
            self._processing -= 1

    def look(self) -> list[WorkCompletion]:
        """What the CQ holds (up to 64 completions), polled by a program's own call.  A
        program that only waits in its own calls comes back to the CQ at its next one (a
        streaming sender's next send): its looks count as a waiter's
        (:meth:`CompletionQueue.waiting`); one that waits in select on readiness
        descriptors (an event loop) sleeps elsewhere between its calls."""
        if not self.wake.watched:
            self.cq.waiting()
        return self.cq.poll(64)

    def _process(self, first: list[WorkCompletion] | None) -> None:  # (process()'s work)
        engine, now = self.engine, monotonic()
        wcs = first or self.look()
        wr = self.wr
        recv_slot, recv_buf = wr.recv_slot, wr.recv_mr.buf
        while wcs:
            # consecutive receives of one QP go to the engine together (it coalesces CDCs)
            batch: list[memoryview] = []
            batch_qpn = 0
            for wc in wcs:
                if wc is TAKEN_IN_PLACE:  # (the actions of CDCs before what follows)
                    self.execute(self.in_place.take_actions())
                    continue
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
                    batch.append(wr.long_message(wc, off))
                wr.again(batch_qpn, wc.wr_id)
            if batch:
                self._received(batch_qpn, batch, now)
            # a full batch may have left more; a short one did not (anything newer
            # rings the armed CQ, and a waiter arms before it sleeps)
            wcs = self.cq.poll(64) if len(wcs) == 64 else []
        if wr.repost_due:
            wr.repost_due = False
            wr.repost(self.qps, False)
        if now >= self.timer_check:  # engine deadlines are >= 1 s away when made
            for qpn, since in self.qp.delivered(now):
                engine.link_delivered(qpn, since)
            deadline = engine.get_timer()
            if deadline is not None and deadline <= now:
                self.execute(engine.handle_timer(now))
                deadline = engine.get_timer()
            self.checks.run(now)
            for conn_id in self.trim.run(now, self.conns, engine.conns, self.qps):
                self.execute(engine.data_consumed(conn_id, 0, now, force=True))
            self.timer_check = now + TIMER_GRAIN
            if deadline is not None:
                self.timer_check = min(self.timer_check, deadline)
        touched = engine.touched
        if not touched:
            return
        self.trim.arm(now)
        if self.shutdowns:
            self._shutdown_sent(touched)
        engine.touched = set()
        if self.wake.app_polls_elsewhere():
            self.wake.kick()  # the app poller may sleep on a doorbell this thread drained
        for conn_id in touched:
            hc = self.conns.get(conn_id)
            if hc is not None:
                self._wake_waiters(hc)
                if hc.readiness is not None:
                    self.update_readiness(hc)

    def _received(self, qpn: int, messages: list[memoryview], now: float) -> None:
        """SENDs that arrived on a QP, in order, to the engine (their slots are not
        reposted before this returns)."""
        tap = self.taps.tap
        if tap is not None:
            tap.received(self.taps.host, qpn, messages)
        engine = self.engine
        actions = engine.receive_wrs(qpn, messages, now)
        if actions or engine.has_events():
            self.execute(actions)

    def _completion(self, wc: WorkCompletion, now: float) -> None:
        engine = self.engine
        status, qpn, wr_id = wc.status, wc.qp_num, wc.wr_id
        if wc.opcode is _RECV:
            slot = self.wr.recv_slot.get(wr_id)
            if status is not _SUCCESS or slot is None:
                self.wr.free_slot(wr_id)
                if self.port_check is not None:
                    self.port_check(qpn)
                qp = self.qps.get(qpn)
                self.execute(engine.link_failed(qpn, f"receive {status.name}", now,
                                                peer_gone=qp is not None and qp.peer_gone))
                return
            off = slot * SLOT
            if wc.byte_len <= SLOT:
                self._received(qpn, [self.wr.recv_mr.buf[off : off + wc.byte_len]], now)
            else:
                self._received(qpn, [self.wr.long_message(wc, off)], now)
            self.wr.again(qpn, wr_id)
            return
        if status is not WcStatus.SUCCESS:
            if self.port_check is not None:
                self.port_check(qpn)
            qp = self.qps.get(qpn)
            self.execute(engine.link_failed(qpn, f"send {status.name}", now,
                                            peer_gone=qp is not None and qp.peer_gone))
            return
        self.execute(engine.send_completed(qpn, wr_id, True, now))

    def link_failed_all(self, qpns: list[int], reason: str) -> None:
        """QPs whose RNIC went (:meth:`Stack.port_down`): any link still over them fails,
        and each goes to ERR, so that what it had posted completes as flushes."""
        now = monotonic()
        for qpn in qpns:
            if qpn in self.qps:
                self.execute(self.engine.link_failed(qpn, reason, now))
            self.qp.to_err(qpn)

    # ================================================================ sending

    def corked(self, c: Connection) -> None:
        """A send of ``c`` was corked (lock held): the peer's answer flushes it, and someone
        must be there to take that answer while the application does other things -- the
        progress thread, which therefore does not stand by while bytes are corked.  Free
        when a corking was already under way."""
        if not self.corked_any:
            self.corked_any = True
            self.wake.wake_progress()

    def uncork(self, hc: HostConn | None = None) -> None:
        """Send the corked bytes of ``hc``'s connection, or of every connection, now (lock
        held): no send will come after a close or at exit, and waiting for the peer's
        answer would only delay the close -- or, at exit, lose the bytes when the links
        end first."""
        conns = self.engine.conns
        ids = list(conns) if hc is None else [hc.conn_id]
        now = monotonic()
        for conn_id in ids:
            c = conns.get(conn_id)
            if c is not None and c.tx_app > c.tx_sent and not c.reset_reason:
                self.execute(self.engine.data_written(conn_id, 0, now))

    def shutdown_write(self, hc: HostConn) -> None:
        """``shutdown(SHUT_WR)`` (lock held): the done-writing CDC goes after the last byte
        of the send buffer, as TCP's FIN goes after its data, however long the peer takes
        to make room for it; until then the connection is in :attr:`shutdowns`."""
        c = self.engine.conns.get(hc.conn_id)
        if c is None:
            return
        self.uncork(hc)
        if c.tx_pending() and not c.reset_reason and not c.peer_closed:
            self.shutdowns[hc.conn_id] = hc
            return
        self.execute_to(hc, self.engine.shutdown_write(hc.conn_id, monotonic()))
        self.update_readiness(hc)

    def _shutdown_sent(self, touched: set[int]) -> None:
        """Send the done-writing CDCs whose send buffers are out now (lock held)."""
        for conn_id in touched & self.shutdowns.keys():
            c = self.engine.conns.get(conn_id)
            if c is None or not c.tx_pending() or c.reset_reason or c.peer_closed:
                del self.shutdowns[conn_id]
                if c is not None:
                    self.execute(self.engine.shutdown_write(conn_id, monotonic()))

    # ================================================================ CLC

    def clc_read(self, hc: HostConn) -> None:
        """Feed CLC bytes from a handshaking connection's TCP socket to the engine."""
        now = monotonic()
        try:
            data = hc.tcp.recv(4096)
        except BlockingIOError:
            return
        except OSError as exc:
            hc.tcp_error = exc.errno or 0
            data = b""
        if data:
            tap = self.taps.tap
            if tap is not None:
                tap.receive_clc(self.taps.host, hc.conn_id, data)
            self.execute(self.engine.receive_clc(hc.conn_id, data, now))
        else:
            self.clc.remove(hc)  # EOF stays readable: look no more
            self.execute(self.engine.tcp_closed(hc.conn_id, now))


def feed_local_clc(ex: Executor) -> None:
    """Let the handshakes of ours that CLC was sent to read it (:meth:`ClcWatch.sent`)."""
    clc = ex.clc
    if clc.feeding:
        return  # (the outermost execute feeds them)
    clc.feeding = True
    try:
        while clc.local:
            peer = clc.local.pop(0)
            if peer.ends is not None and peer.outcome is None:
                ex.clc_read(peer)
    finally:
        clc.feeding = False


def _close_quietly(sock: socket.socket) -> None:
    """Close a runtime's TCP socket, which the application may have shut or reset."""
    try:
        sock.close()
    except OSError:
        pass


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


def post_inline(ex: Executor, c: Connection, data: memoryview, request: bool) -> None:
    """:meth:`Executor.send_inline`'s post: by the lane, or the Python's."""
    qp = ex.qps.get(c.qpn)
    if ex.keep_copy:
        ring_write(ex.conns[c.id].sndbuf, c.tx_sent, data)
    elif qp is not None and (send_inline := inplace.SEND_INLINE) is not None:
        whom: int = send_inline(c, qp, data, request)  # (the lane's common case)
        if whom >= 0:
            if whom:
                qp.ring_after(whom)
            return
    writes, cdc, wr_id, signaled = c.write_inline(data, request)
    try:
        if qp is None:
            raise OSError("the link's QP is gone")
        qp.post_writes_send(writes, cdc, wr_id, signaled, c.peer_token)
    except OSError:  # a full send queue or a dead QP: the general path's waiting and verdict
        ex.cq.poster_looks = False  # (its wait for a slot may be long: completions ring again)
        ex.post(c.qpn, [], writes, PostSend(c.qpn, cdc, wr_id, signaled))
