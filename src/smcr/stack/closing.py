"""Closing connections in the background, as the kernel finishes a closed socket's work
(Linux ``smc_close.c``: ``smc_close_active``, ``smc_close_wait_tx_pends``).

* ``close()`` without ``SO_LINGER`` returns at once, as TCP's does, while the send buffer
  still holds bytes: the progress thread sends the rest, then the closing CDC
  (:meth:`Closing.close_later`).
* A socket collected unclosed hands its connection over without the lock
  (:meth:`Closing.orphan`): the collector may run inside code that holds it.
* An abortive close (``SO_LINGER`` 0) resets at once (:meth:`Closing.abort`).
* At exit the connections left open close as TCP's kernel closes an exiting process's
  sockets, and the links end after the closes under way (:meth:`Closing.end_links`).
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections import deque

from smcr.bound import monotonic
from smcr.core import ShutdownTcp
from smcr.stack.executor import Executor
from smcr.stack.hostconn import HostConn

_LINGER_ZERO = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets the connection
EXIT_DELETE_WAIT = 1.0
"""At exit, how long the peers may take to answer our DELETE LINK with theirs."""
EXIT_LINGER = 2.0
"""At exit, how long closes under way may take before the links end (:meth:`Closing.end_links`;
``SMC_MAX_STREAM_WAIT_TIMEOUT``, the wait of a close for its data)."""
EXIT_QUIET = 0.3
"""At exit, how long the QPs a peer may still use must stay silent (all of ours acknowledged,
nothing new delivered) before they go."""
EXIT_SILENT = 2.0
"""... or, with sends of ours unacknowledged, how long nothing may move at all (a peer gone;
as an LLC wait gives up on a silent link: under heavy loss a sender whose ACKs are lost
hears nothing for over a second while its data still gets through)."""
EXIT_KEEP = 60.0
"""At exit, the longest the closes and those QPs may take while they still move (a slow link
under heavy loss delivers a connection's last megabytes in tens of seconds; TCP's kernel
would deliver them after the process had gone, smcr's RNIC goes with the process)."""


def drain_deadline(now: float, deadline: float, began: float, mark: int | None,
                   moved: int | None, wait: float) -> float:  # fmt: skip
    """When a close that waits for its send buffer gives up (:meth:`Closing.reap`): at
    ``deadline``, unless that has come and its QP's delivery mark went from ``mark`` to
    ``moved`` meanwhile (the link delivers: slow, not stuck), then ``wait`` more seconds;
    never extended past :data:`EXIT_KEEP` after the wait ``began``."""
    if now >= deadline and now < began + EXIT_KEEP and moved is not None and moved != mark:
        return now + wait
    return deadline


class Closing:
    """Closes of one runtime that the application does not wait for (module docstring)."""

    def __init__(self, ex: Executor, pid: int) -> None:
        self.ex = ex
        self.pid = pid
        self.running = True
        """False once the runtime closes: orphans are no longer taken."""
        self.orphans: deque[tuple[HostConn, float | None]] = deque()
        """Connections whose socket was collected unclosed (:meth:`orphan`), for the progress
        thread; a deque: appended from any thread without the lock."""
        self.draining: dict[int, tuple[HostConn, float, int, int | None, float]] = {}
        """Closed connections (orphans, and closes without SO_LINGER: :meth:`close_later`)
        waiting for their send buffer before the closing CDC: (connection, deadline,
        bytes unsent at the last look, its QP's delivery mark then, when the wait began:
        its link's delivering extends the wait for :data:`EXIT_KEEP` at most, as a peer
        that never reads, on a link busy with other connections, would hold it for
        good)."""
        self.left_open: set[int] = set()
        """Connections the application left open, closed at exit (:meth:`close_left_open`)."""

    def busy(self) -> bool:
        """Whether closes wait for the progress thread (read without the lock is fine: a
        stale look costs one more round)."""
        return bool(self.orphans or self.draining)

    def app_close(self, hc: HostConn) -> None:
        """The application closed the connection (lock held; the host waited for the send
        buffer first): the closing CDC (:meth:`Engine.close`); a connection the engine has
        forgotten already is let go here."""
        ex = self.ex
        ex.shutdowns.pop(hc.conn_id, None)
        ex.execute_to(hc, ex.engine.close(hc.conn_id, monotonic()))
        ex.let_go(hc)

    def abort(self, hc: HostConn) -> None:
        """Abortive close (lock held): ``SO_LINGER`` on with a linger time of 0
        (:meth:`Engine.abort`): the send buffer dropped, an abort CDC; the application is
        done at once, the connection and its RMB go when the peer's closing CDC answers
        (:meth:`Connection.app_abort`).  The TCP connection is reset now, as a TCP
        socket's abortive close resets it (a peer that looks at its TCP socket, ssl's
        ``wrap_socket`` for one, sees it unconnected at once); only the RMB waits."""
        ex = self.ex
        actions = ex.engine.abort(hc.conn_id, monotonic())
        c = ex.engine_conn(hc)
        if c is None or hc.released:
            ex.execute(actions)
        else:  # (no FIN before the reset: a peer in CLOSE_WAIT would read EPIPE, not ECONNRESET)
            # a local peer's completions are taken once the TCP connection is reset (what
            # they bring may release the connection, and its TCP socket with a FIN)
            local = ex.local_peer(hc, c)
            armed = local and ex.cq.take_arm()
            try:
                ex.execute([a for a in actions if not isinstance(a, ShutdownTcp)])
                ex.clc.unwatch_tcp(hc)
                try:
                    hc.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
                    hc.tcp.close()
                except OSError:
                    pass
            finally:
                if local:
                    ex.local_end(armed)
        ex.let_go(hc)

    def peer_tcp_ended(self, hc: HostConn) -> None:
        """An SMC-R connection's TCP socket became readable: the peer closed it, or died.

        Over the RoCE RNIC a killed peer process leaves only its kernel's FIN/RST,
        so the engine tests the link at once (:meth:`Engine.probe_link`): a live
        peer answers, a dead one does not and the connection is reset within
        ``llc_wait`` (or the QP's retry exceeded).  The socket is watched no more
        (bytes there, which SMC-R never sends, would wake us in a loop).
        """
        ex = self.ex
        try:
            hc.tcp.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            ex.clc.watch_end(hc)  # a spurious wakeup
            return
        except OSError:
            pass
        if not hc.released:
            ex.execute(ex.engine.probe_link(hc.conn_id, monotonic()))

    def orphan(self, hc: HostConn, linger: float | None) -> None:
        """Close a connection whose socket was garbage-collected unclosed; any thread,
        lock-free (the collector may run inside code that holds the runtime's lock).

        The progress thread does it (:meth:`reap`): it waits, without blocking anyone, for
        the send buffer to go out as ``close()`` would (``linger`` seconds, or
        ``close_wait_tx`` when None; 0 aborts), then sends the closing CDC.  Nothing
        happens in a runtime that is closed or was inherited by a forked child.
        """
        if not self.running or self.pid != os.getpid():
            return
        self.orphans.append((hc, linger))
        self.ex.wake.kick()
        self.ex.wake.wake_progress()

    def close_later(self, hc: HostConn) -> None:
        """The application closed a connection whose send buffer is not out yet, without
        ``SO_LINGER`` (lock held): ``close`` returns at once, as TCP's does, and the
        progress thread sends the rest, then the closing CDC (:meth:`reap`).
        Why: TCP's kernel goes on sending after ``close``; a program whose peer is
        served by the very thread that closes (an event loop running both ends)
        would wait in ``close`` for a peer that cannot read meanwhile, and lose the
        rest when the wait ended (CPython's asyncio test_sendfile).  The wait ends
        after ``close_wait_tx`` (2 s) in which the peer took nothing, not 2 s in all,
        and not while the connection's link still delivers (its QP's delivery mark moved,
        :meth:`QueuePairs.mark_of <smcr.stack.qps.QueuePairs.mark_of>`: under heavy loss
        the peer's cursor updates come seconds apart).  A wait that ends with bytes
        unsent ends in an abort (:meth:`Connection.close_step
        <smcr.core.connection.Connection.close_step>`), never in a close that would end
        the peer's stream short."""
        ex = self.ex
        ex.uncork(hc)  # (nothing follows: corked bytes go now)
        self._drain(hc, monotonic() + ex.config.close_wait_tx)
        ex.wake.kick()
        ex.wake.wake_progress()

    def close_left_open(self) -> None:
        """At exit (lock held): the connections the application left open close as the
        kernel closes an exiting process's TCP sockets: their send buffers go out first
        (:meth:`reap`, within the exit's wait), then the closing CDC (an abort where
        unread bytes remain, as TCP then resets), so the peer reads every byte and then
        EOF, where the DELETE LINK that ends the links would have reset them with the tail
        of the send buffer unsent.  The peer's own close is not waited for, as a TCP exit
        does not wait for the peer's FIN (:attr:`left_open`).  Connections still in their
        handshake, or collected unclosed (:meth:`orphan`), are left to their own ends."""
        ex = self.ex
        orphans = {hc.conn_id for hc, _ in self.orphans}
        for hc in list(ex.conns.values()):
            c = ex.engine_conn(hc)
            if (c is None or c.released or hc.undecided() or hc.conn_id in self.draining
                    or hc.conn_id in orphans):  # fmt: skip
                continue
            self.left_open.add(hc.conn_id)
            if ex.local_peer(hc, c):  # (its peer, in this process too, reads no more)
                self.app_close(hc)
            else:
                self.close_later(hc)

    def reap(self) -> None:
        """Close the orphans whose send buffer is out or whose wait is over (lock held)."""
        ex = self.ex
        now = monotonic()
        while self.orphans:
            hc, linger = self.orphans.popleft()
            if linger == 0:
                self.abort(hc)
            else:
                self._drain(hc, now + (ex.config.close_wait_tx if linger is None else linger))
        for conn_id, (hc, waited, unsent, mark, began) in list(self.draining.items()):
            c = ex.engine_conn(hc)
            deadline = waited
            if c is not None and now >= deadline:
                moved = ex.qp.mark_of(c.qpn)
                deadline = drain_deadline(now, waited, began, mark, moved, ex.config.close_wait_tx)
                if deadline != waited:
                    self.draining[conn_id] = (hc, deadline, unsent, moved, began)
            if (c is None or c.tx_pending() == 0 or bool(c.reset_reason) or c.peer_closed
                    or now >= deadline):  # fmt: skip
                del self.draining[conn_id]
                self.app_close(hc)
            elif c.tx_pending() < unsent:  # the peer reads: it gets the time again
                self.draining[conn_id] = (hc, now + ex.config.close_wait_tx, c.tx_pending(),
                                          ex.qp.mark_of(c.qpn), began)  # fmt: skip

    def _drain(self, hc: HostConn, deadline: float) -> None:
        """Wait for ``hc``'s send buffer until ``deadline`` (:meth:`reap`), noting the bytes
        unsent and its QP's delivery mark now (lock held)."""
        c = self.ex.engine_conn(hc)
        was = self.draining.get(hc.conn_id)
        self.draining[hc.conn_id] = (hc, deadline, c.tx_pending() if c is not None else 0,
                                     self.ex.qp.mark_of(c.qpn) if c is not None else None,
                                     monotonic() if was is None else was[4])  # fmt: skip

    def end_links(self, deadline: float) -> None:
        """Before the RNIC goes: the connections left open close (:meth:`close_left_open`),
        closes under way finish (the progress thread carries
        them: the peer's last CDCs are received and acknowledged, DELETE RKEY flows
        answered) until ``deadline``, which moves :data:`EXIT_LINGER` past each sign that
        the links deliver (:meth:`QueuePairs.marks <smcr.stack.qps.QueuePairs.marks>`),
        :data:`EXIT_KEEP` at most; then every link group ends with DELETE LINK
        (:meth:`Engine.shutdown`), the links kept until the peer's DELETE LINK has come
        (Linux sends one back) or :data:`EXIT_DELETE_WAIT` is over, and the QPs of groups
        the peer may still use after that until they are quiet (:meth:`_keep_until_quiet`).
        Corked bytes go first (:meth:`Executor.uncork`): the peer's answer that would send
        them may come after the links have ended, and they would be lost."""
        ex = self.ex
        with ex.lock:
            ex.uncork()
            self.close_left_open()
            marks = ex.qp.marks()
        longest = monotonic() + EXIT_KEEP
        done = False  # (no `break` inside `with`: mypyc does not compile it)
        while not done:
            with ex.lock:
                now = monotonic()
                seen = ex.qp.marks()
                if seen != marks:  # the links deliver (RoCE): the closes get the time again
                    marks, deadline = seen, min(max(deadline, now + EXIT_LINGER), longest)
                done = not (ex.engine.closing(self.left_open) or self.busy()) or now >= deadline
                if done:
                    ex.qp.keep = ex.engine.links_peers_may_use()
                    ex.execute(ex.engine.shutdown(monotonic()))
            if not done:
                ex.wake.kick()
                time.sleep(0.005)
        answered = monotonic() + EXIT_DELETE_WAIT
        done = False
        while not done:  # the peers' DELETE LINKs, received and acknowledged
            with ex.lock:
                done = not ex.engine.ending() or monotonic() >= answered
                if done:
                    ex.qp.keep |= ex.engine.links_peers_may_use()
                    ex.execute(ex.engine.shutdown(monotonic(), final=True))
            if not done:
                ex.wake.kick()
                time.sleep(0.005)
        self._keep_until_quiet(longest)

    def _keep_until_quiet(self, longest: float) -> None:
        """Keep the QPs a peer may still send over (:attr:`QueuePairs.keep
        <smcr.stack.qps.QueuePairs.keep>`) until they have been quiet for
        :data:`EXIT_QUIET` (or, with sends of ours unacknowledged, silent for
        :data:`EXIT_SILENT`), until ``longest`` at most (:data:`EXIT_KEEP` after the exit
        began, the closes' wait included; :data:`EXIT_SILENT` if that has passed); then
        destroy them.  Meanwhile the
        progress thread takes what arrives (a Linux peer's abort CDCs as it kills the
        connections of a group that ended) and reposts the receives, so that the peer's
        RC sends complete and its close ends (:meth:`Engine.links_peers_may_use
        <smcr.core.engine.Engine.links_peers_may_use>`)."""
        ex = self.ex
        now = moved = monotonic()
        end = max(longest, now + EXIT_SILENT)  # the exit's one deadline, some time left
        with ex.lock:
            acked, marks = ex.qp.quiet()
        while (ex.qp.kept and now < end
               and now - moved < (EXIT_QUIET if acked else EXIT_SILENT)):  # fmt: skip
            ex.wake.kick()
            time.sleep(0.01)
            now = monotonic()
            with ex.lock:
                acked, seen = ex.qp.quiet()
            if seen != marks:
                marks, moved = seen, now
        with ex.lock:
            ex.qp.destroy_kept()
