"""Progress and waiting: who takes the runtime's news, and how a thread waits for it.

* **Progress does not depend on the application.**  A daemon thread answers TEST LINK,
  CONFIRM/DELETE RKEY, and takes CDCs (window updates, close flags) while the
  application computes.  It sleeps in ``poll`` on the CQ's descriptor and on the
  engine's next deadline: it never spins.
* **Whoever waits, polls.**  A thread blocked in ``recv``/``send`` does not wait for
  the progress thread to hand it the news (two wakeups per message, one of them a
  thread hop under the GIL); it becomes the *poller* itself and sleeps on the CQ
  descriptor, so a message costs one wakeup, as in TCP.  A thread blocked in
  ``accept`` polls the same way (:meth:`Progress.poll_until`): it reads the
  handshakes' CLC messages itself, whose TCP sockets pollers sleep on through one
  epoll descriptor (a new one needs no doorbell).  One application thread at a time
  holds the poller role (:mod:`smcr.stack.wakeup`); others wait on their
  connection's condition, which the poller notifies; the progress thread steps back
  while an application thread polls.  Before it arms the CQ and sleeps, a waiter
  may watch it for up to :data:`SPIN` while a CPU is free (:mod:`smcr.stack.spin`): an
  answer that comes within microseconds then costs no doorbell, no sleep and no wakeup
  on either side.  A blocking ``connect`` waiting for the server's Accept, and an
  ``accept`` whose handshake waits for the client's Confirm, watch the handshakes' TCP
  sockets the same way, for up to :data:`CLC_SPIN`.  Where no spin is allowed (a crowded
  host), a blocking read's wait takes the same steps in C (:mod:`smcr.stack.waiter`).
* **News between two polls is heard at once** by whoever may await it.  When an
  application thread stops polling (its ``recv`` returned) and someone may await what
  comes before its next call (:meth:`Progress.standby_needed`: the program watched a
  readiness descriptor, another thread waits, handshakes or closes are under way), it
  arms the CQ for the progress thread's standby (:data:`~smcr.rdma.completion.ARM_STANDBY`)
  and looks once more; a program that only waits in its own calls takes the news at its
  next one.  A program that then waits elsewhere (``select`` on the connection's readiness
  descriptor) has its peer's answer taken by the standing-by progress thread when it
  comes, not at the next look-in (up to :data:`STANDBY_IDLE` later): a peer's SEND rings
  the standby doorbell.  (Where the CQ's pollers receive the provider's packets, RoCE, the
  progress thread of such a program does not stand by but sleeps on the CQ: it reads the
  answers itself, rather than be rung by the RNIC's thread that read them.)
  The arm is good for one ring; after it the progress thread looks
  in every :data:`STANDBY` and takes the CQ over when no application thread polled for
  that long.  Arming it again after each ring cost streams: a reader that finds its bytes
  there without waiting polls no more, and the progress thread then woke for every
  message the writer sent, taking them one by one and the GIL with them (64 KiB writes
  fell from 1.4-1.8x TCP to 0.95-1.3x).  A thread that begins to poll takes the arm back,
  so a stream whose reader waits in ``recv`` rings nobody but that reader; and the first
  send after a read holds the arm while it posts (:meth:`Progress.send_ended`), so that
  an answer that comes before the thread is back in ``recv`` rings nobody either.
"""

from __future__ import annotations

import os
import select
import sys
import time
import traceback
from collections.abc import Callable
from typing import Final

from smcr import exits, settings
from smcr.bound import get_ident, monotonic
from smcr.core.handshake import HsState
from smcr.locks import give, take
from smcr.osthreads import NamedThread
from smcr.rdma import WorkCompletion, doorbell
from smcr.rdma.completion import ARM_PROGRESS, ARM_SLEEPER, ARM_STANDBY
from smcr.stack.closing import Closing
from smcr.stack.counters import COUNTERS
from smcr.stack.executor import Executor
from smcr.stack.hostconn import HostConn
from smcr.stack.spin import SpinPolicy

STANDBY: Final = 0.01  # the progress thread's look-in period after an application polled
STANDBY_IDLE: Final = 0.1
"""Its first look-in after that while an application thread polls now (asleep on the CQ,
say in a blocked ``recv``); each further look that finds it still polling waits twice as
long, up to :data:`STANDBY_LONGEST`.  That thread takes the news meanwhile (timers
included), and when a wait that long ends it rings the progress thread
(:meth:`Progress._hand_back`), so the look-ins are only a safety net: an idle blocked
connection should cost almost no wake-ups, which are not free (on a virtual machine of
the kind we run on a thread woken from a timed wait costs about a millisecond of CPU)."""
STANDBY_LONGEST: Final = 1.6
LONGEST_SLEEP: Final = 4.0
"""The longest a poller sleeps on the CQ without a deadline of its own or the engine's: news
rings it (completions, doorbells, CLC sockets) and timers bound the sleep, so this is a
safety net, long enough that a blocked idle connection costs a wake-up only now and then."""
SPIN: Final = settings.spin_seconds()
"""The longest an application thread that waits polls the CQ before it arms it and sleeps
(:class:`~smcr.stack.spin.SpinPolicy` decides how long, and whether)."""
CLC_SPIN: Final = 300e-6
"""The longest a thread that waits for a handshake's next CLC message (a client's for the
Accept, an ``accept``'s for the Confirm) watches for it before it sleeps, where the spin
policy lets it spin at all (:data:`SPIN` not 0, the host not crowded): the peer's side of
a step takes about 100 us here, and a sleep costs a wake-up of an idle virtual CPU on top
(about 50 us on this kind of machine), three of them in a connection's set-up."""
CLC_SPIN_MOST: Final = 8
"""Handshakes under way past which an ``accept`` does not spin (:meth:`Progress._confirm_due`)."""


class Progress:
    """The waiting and the progress thread of one runtime (module docstring)."""

    def __init__(self, ex: Executor, closing: Closing) -> None:
        self.ex = ex
        self.closing = closing
        self.wake = ex.wake
        self.running = True
        self.exiting = False
        """The process is ending (:meth:`Stack.close_at_exit
        <smcr.stack.runtime.Stack.close_at_exit>`): the threads whose wait ends then stay
        parked where :func:`smcr.exits.stays_parked` says so (:meth:`wait`)."""
        self.spin = SpinPolicy(SPIN)
        self.clc_spin = SpinPolicy(CLC_SPIN if SPIN > 0.0 else 0.0)
        """The spinning of waits for a handshake's next CLC message: its own pauses after
        misses (a peer slow to answer), not the data path's."""
        self._standby_poll = select.poll()
        self._standby_poll.register(self.wake.standby_r.fileno(), select.POLLIN)
        self._standby_poll.register(ex.cq.standby_fileno(), select.POLLIN)
        clc = ex.clc
        self._cq_fd, self._clc_fd, self._tcp_fd = (ex.cq.fileno(), clc.ep.fileno(),
                                                   clc.tcp_ep.fileno())  # fmt: skip
        """The descriptors every poller sleeps on beside its bell (each lives as long as
        the runtime): which one woke a sleeper is told by number, with no call."""
        self._sleep_app = self._sleeper(self.wake.bell(False).fileno())
        self._sleep_bg = self._sleeper(self.wake.bell(True).fileno())
        self.sleep_app_fd = self._sleep_app.fileno()
        """The application pollers' epoll descriptor, by number (the lane's wait sleeps on
        it: :mod:`smcr.stack.waiter`)."""
        self.thread = NamedThread(target=self._progress_thread, name="smcr-progress",
                                       daemon=True)  # fmt: skip

    def _sleeper(self, bell: int) -> select.epoll:
        """What a poller sleeps on: the CQ's descriptor, its own doorbell and the
        handshakes' two epoll descriptors, in one epoll descriptor made once (a ``poll``
        built per sleep cost a registration and a wait-queue entry per descriptor every
        message: a sleep on one descriptor is what TCP's blocked ``recv`` pays)."""
        ep = select.epoll()
        edge = select.EPOLLET if self.ex.cq.edge_signals else 0
        ep.register(self._cq_fd, select.EPOLLIN | edge)  # (no drain per wake-up: arming)
        for fd in (bell, self._clc_fd, self._tcp_fd):
            ep.register(fd, select.EPOLLIN)
        return ep

    def start(self) -> None:
        """Start the progress thread."""
        self.thread.start()

    # ================================================================ waiting

    def wait(self, hc: HostConn, ready: Callable[[], bool], deadline: float | None,
             spin: float = SPIN, clc: bool = False) -> bool:
        """Block until ``ready()`` (lock held); polls the CQ itself when it can (module doc).

        :param spin: seconds to watch the CQ before sleeping (:data:`SPIN`); 0 for one
            that never watches.
        :param clc: the wait is for a handshake's next CLC message, which comes over TCP:
            the handshakes' sockets are watched too, for up to ``spin`` (:data:`CLC_SPIN`),
            as far as their own spin policy allows (:attr:`clc_spin`).
        :returns: ``ready()`` at the end (False on timeout).
        """
        began = 0.0  # when this thread began to poll (0: it did not)
        while not ready():
            left = None if deadline is None else deadline - monotonic()
            if left is not None and left <= 0:
                if began:
                    self._hand_back(began)
                self._park_at_exit(hc)
                return False
            if self.wake.poller == "app":
                hc.waiters += 1
                self.wake.waiting += 1
                try:
                    hc.waitable(self.ex.lock).wait(left if left is not None else 1.0)
                finally:
                    hc.waiters -= 1
                    self.wake.waiting -= 1
                continue
            began = began or monotonic()
            self._app_poll(left, spin, clc)
        if began:
            self._hand_back(began)
        self._park_at_exit(hc)
        return True

    def _park_at_exit(self, hc: HostConn) -> None:
        """A thread whose wait ends while the process exits stays here (lock held: the
        wait gives it up) until the process is gone, where :func:`smcr.exits.stays_parked`
        says so (a daemon thread; any thread when a signal ends the process).  Under TCP
        such a thread sleeps on until the kernel ends it, and sees nothing of the exit;
        here the exit's own work (the closes of connections left open, another end in
        this process closing, the links' end) would otherwise wake it with an EOF or an
        error to act on."""
        if self.exiting and exits.stays_parked():
            while True:
                hc.waitable(self.ex.lock).wait()

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
        began = 0.0
        while not ready() and self.wake.poller != "app" and self.running:
            left = None if deadline is None else deadline - monotonic()
            if left is not None and left <= 0:
                break
            began = began or monotonic()
            self._app_poll(left, CLC_SPIN if self._confirm_due() else 0.0, True)
        if began:
            self._hand_back(began)
        return bool(began)

    def _confirm_due(self) -> bool:
        """Whether a server's handshake waits for the client's Confirm (its Accept went):
        an ``accept`` spins for that only, not for the next client, who may be long in
        coming, nor while the watcher thread still works on a Proposal (the spin would take
        the CPU, and the GIL, from it).  Not looked for among many handshakes at once: the
        host is busy then, and spinning does not pay."""
        handshakes = self.ex.engine.handshakes
        if not handshakes or len(handshakes) > CLC_SPIN_MOST:
            return False
        return any(hs.state is HsState.CONFIRM_WAIT for hs in handshakes.values())

    def _app_poll(self, left: float | None, spin: float = 0.0, clc: bool = False) -> None:
        """One round of an application thread polling the CQ for everyone (lock held;
        :meth:`wait`, :meth:`poll_until`): it is the poller meanwhile, and others stand by.

        A progress thread asleep on the CQ is woken to stand by: were both asleep on the
        CQ's doorbell, whichever took the lock first would drain it, and the other's
        ``poll`` would sleep on to its deadline, the CQ no longer armed -- news that came
        next rang nobody (a second connection's bytes waited up to a second, one time in
        three, when a blocked reader on the first one returned).
        """
        wake = self.wake
        if wake.poller == "bg":
            wake.kick_progress()
        wake.poller = "app"
        wake.poller_ident = get_ident()
        self.ex.cq.take_standby()  # (this thread hears the news now)
        try:
            self._sleep_on_cq(left, spin, clc)
        finally:
            wake.set_poller(None)
            wake.app_polled = monotonic()

    def _hand_back(self, began: float) -> None:
        """An application thread stops polling (lock held; it began at ``began``).  Unless
        another one polls, the CQ is armed for the progress thread's standby and looked at
        once more where someone may await what comes before this thread polls again
        (:meth:`standby_needed`; module doc: what a peer sends next is heard at once).
        The progress thread takes over at once rather than at its next look when
        handshakes are under way (a connect given up at its timeout, an accept queue's
        others), or when this thread polled for longer than :data:`STANDBY` -- the progress
        thread then stood by for :data:`STANDBY_IDLE`, and timers would wait for it.  After
        a short wait (a stream's next message) it does not: a ring per message would cost
        more than the look-ins."""
        wake = self.wake
        if wake.poller is not None:
            return
        ex = self.ex
        if self.standby_needed():
            self.arm_standby()
        if ex.clc.watch or monotonic() - began > STANDBY:
            wake.wake_progress()

    def standby_needed(self) -> bool:
        """Whether news that comes before the calling thread polls again may be awaited
        meanwhile: by the program's ``select`` or event loop (it watched a connection's
        readiness descriptor once: :attr:`Wakeups.watched`), by threads waiting on their
        connection's condition (:attr:`Wakeups.waiting`), by handshakes, corked bytes or
        closes under way.  Otherwise it is only the calling thread's, which takes it at
        its next call (a blocking program's ``send`` then ``recv``), and the standby arm
        would cost a request/response program about a quarter of its CPU: the arm, the
        look after it, the send taking it and arming it again, the poll taking it once
        more, at every round trip.  The progress thread still looks in every :data:`STANDBY` (LLC
        requests, timers)."""
        ex = self.ex
        wake = self.wake
        return (wake.watched or wake.waiting > 0 or bool(ex.clc.watch)
                or bool(ex.engine.handshakes) or ex.corked_any
                or self.closing.busy())  # fmt: skip

    def arm_standby(self) -> None:
        """Arm the CQ for the progress thread's standby and look once more (lock held; no
        application thread polls): what a peer sends from now on rings the progress
        thread, and the next send takes the arm while it posts (:meth:`send_ended`)."""
        self.ex.cq.req_notify(ARM_STANDBY)
        self.wake.send_takes_standby = True
        self.ex.process()

    def send_ended(self) -> None:
        """After a send that took the CQ's standby arm (lock held): armed for the standby
        again, and looked at once more for what came meanwhile without a ring.

        Why a send takes it: a program that waits for answers in a blocking ``recv`` hands
        the CQ to the standby at each return (:meth:`_hand_back`), then sends its next
        request; the peer, woken by that send, often answers before this thread is back
        in ``recv`` (on a busy host it preempts this thread right in the send's doorbell
        call), and the answer rang the standing-by progress thread: a thread wake-up, the
        lock and the GIL handed over, nearly every round trip.  Disarmed during the send,
        the peer rings nobody, and this look takes its answer.

        Where nobody else may await the news (:meth:`standby_needed`) the arm stays
        taken: this thread's next call takes what comes.  Armed again, it kept itself
        going: an answer there before the ``recv`` (as above) leaves the arm untaken, and
        the next send takes it and arms it again, round after round."""
        if not self.standby_needed():
            return
        cq = self.ex.cq
        cq.req_notify(ARM_STANDBY)
        if cq.has_news():
            self.ex.process()

    def _sleep_on_cq(self, left: float | None, spin: float = 0.0, for_clc: bool = False) -> None:
        """Sleep on the CQ descriptor (lock released) until news or the next deadline.

        :param spin: seconds to poll the CQ first (lock released) before arming it
            and sleeping (see :data:`SPIN`).
        :param for_clc: a wait for a handshake's CLC message (:meth:`wait`'s ``clc``).
        """
        ex = self.ex
        cq = ex.cq
        cq.waiting()
        wcs: list[WorkCompletion] = []
        policy = self.clc_spin if for_clc else self.spin
        allowed = 0.0 if spin <= 0.0 else policy.allowance(
            spin if left is None else min(spin, left), self.wake.waiting)
        if for_clc and policy.yields:
            allowed = 0.0  # (one CPU: the peer cannot answer while this thread holds it)
        if allowed > 0.0:  # look, then watch for news before arming
            wcs = cq.poll(64)
            if not wcs:
                wcs, clc_found = self._spin(allowed, for_clc)
                policy.spun(bool(wcs) or clc_found)
                if clc_found:
                    COUNTERS.clc_spin_cnt += 1
        if not wcs:
            # arm, then look: a completion after this look rings (the progress thread's arm
            # lets a peer ring a connection's consumer bell instead: smcr.rdma.bells).  No
            # look before it where no spin follows: the caller's answer is seldom there yet
            # (it asked just now), and an arm that finds it is taken back at once, before a
            # peer rings for it
            if cq.edge_signals:
                cq.arming()
            cq.req_notify(ARM_PROGRESS if self.wake.poller == "bg" else ARM_SLEEPER)
            wcs = cq.poll(64)
            if wcs and not allowed:
                cq.take_arm()
        if not wcs:
            timer = ex.engine.get_timer()
            for due in (ex.checks.due, ex.trim.due):
                if due and (timer is None or due < timer):
                    timer = due
            limit = LONGEST_SLEEP if left is None else left
            if timer is not None:
                limit = min(limit, max(0.0, timer - monotonic()))
                if limit == 0.0:
                    ex.timer_check = 0.0  # due now: process() must run the timers
            bg = self.wake.poller == "bg"
            sleeper = self._sleep_bg if bg else self._sleep_app
            lock = ex.lock
            give(lock)
            try:
                r = sleeper.poll(limit)
            finally:
                take(lock)
            for fd, _ in r:
                if fd == self._cq_fd:
                    if not cq.edge_signals:
                        cq.clear_signal()
                else:
                    self.woke(fd, bg)
        ex.process(wcs)

    def woke(self, fd: int, bg: bool) -> None:
        """What a poller's sleep woke for, other than the CQ (lock held): a handshake's CLC
        message, a handshake's TCP connection that ended, or its doorbell (``bg``: the
        progress thread's).  Also the lane's wait's (:mod:`smcr.stack.waiter`)."""
        ex = self.ex
        clc = ex.clc
        if fd == self._clc_fd:
            for clc_fd in doorbell.ready(clc.ep):
                hc = clc.watch.get(clc_fd)
                if hc is not None:
                    ex.clc_read(hc)
        elif fd == self._tcp_fd:
            for ended in clc.ended():
                self.closing.peer_tcp_ended(ended)
        else:  # our own doorbell (in C: the GIL is kept while the lock is held)
            doorbell.drain(self.wake.bell(bg))
            if self.wake.app_polls_elsewhere():
                # an app thread took over polling while we slept: the ring (a new
                # descriptor to watch) was for it, and it may have gone into its
                # poll just after we drained the bell
                self.wake.kick()

    def _spin(self, seconds: float, clc: bool = False) -> tuple[list[WorkCompletion], bool]:
        """Watch the CQ for up to ``seconds`` with the lock released, then take what came
        (lock held again: completions are handled in order by whoever holds it).  With
        ``clc``, the handshakes' TCP sockets too; the second value says one became readable
        (the sleep that follows returns at once and reads it).

        Without yielding between looks, but with one CPU (:class:`~smcr.stack.spin.SpinPolicy`
        spins there only while the waiter and its peer are all the host runs, so a yield
        hands the CPU to the peer).
        """
        ex = self.ex
        news, clock = ex.cq.has_news, time.monotonic
        until = clock() + seconds
        clc_found = False
        ex.lock.release()
        try:
            if clc:
                clc_news = ex.clc.ep.poll
                while not news() and clock() < until:
                    if clc_news(0):
                        clc_found = True
                        break
            elif self.spin.yields:
                yield_cpu = os.sched_yield
                while not news() and clock() < until:
                    yield_cpu()
            else:
                while not news() and clock() < until:
                    pass
        finally:
            ex.lock.acquire()
        return ex.cq.poll(64), clc_found

    # ================================================================ the progress thread

    def _progress_thread(self) -> None:
        """Own progress while no application thread waits; stand by while one does.

        An application poller hands the CQ back without waking this thread after a short
        wait (that would cost a wakeup per message); this thread looks every
        :data:`STANDBY` seconds instead (:data:`STANDBY_IDLE` while an application thread
        polls), and sleeps on the CQ again only when no application thread polled for
        :data:`STANDBY`.
        """
        with self.ex.lock:
            while self.running:
                try:
                    self._progress_step()
                except Exception:  # a bug must not stop progress for every connection
                    traceback.print_exc(file=sys.stderr)
                    self._standby()  # (and must not spin if it persists)

    def _progress_step(self) -> None:
        """One round of :meth:`_progress_thread` (lock held)."""
        ex = self.ex
        if self.closing.busy():
            self.closing.reap()
        # (handshakes under way need their TCP sockets watched: an app thread that
        # polls watches them too, a standing-by progress thread would not)
        if ex.corked_any:  # (corked bytes wait for a CDC: someone must take it promptly)
            ex.corked_any = any(c.tx_app > c.tx_sent for c in ex.engine.conns.values())
        if self._standing_by():
            if self.wake.poller is None and self.standby_needed():
                # standing by with the CQ unarmed, nobody would hear the news: the ring that
                # woke this thread took the arm, and a program that only makes non-blocking
                # calls and waits in select (an event loop) never hands a poll back
                # (_hand_back), so nothing armed it again.  On shm a send re-arms it (and
                # peers ring consumer bells); on RoCE the reply waited for the next look-in
                # (a quarter of the event-loop round trips took 10 ms)
                self.arm_standby()
            if self._standby() and ex.cq.has_news():
                COUNTERS.late_news_cnt += 1  # (a missed ring: smcr stats -d shows it)
            ex.process()
            return
        self.wake.set_poller("bg")
        try:
            self._sleep_on_cq(STANDBY if self.closing.draining else None)
        finally:
            if self.wake.poller == "bg":
                self.wake.set_poller(None)

    def _standing_by(self) -> bool:
        """Whether the progress thread leaves the CQ to an application thread: one polls,
        or polled within :data:`STANDBY` (or only looked, :attr:`Wakeups.app_looked`), and
        no handshake or corked bytes need watching.

        Looks alone do not count where the program waits in ``select`` (an event loop:
        :attr:`Wakeups.watched`, and no thread of it waited in a call lately) and the
        CQ's pollers receive its provider's packets (RoCE): standing by, this thread
        heard a peer's message only when the RNIC's own thread, which kept the QP's
        socket, had received it and rang the standby doorbell, one thread hop more per
        message than sleeping on the CQ, whose descriptor covers the socket (a 32-byte
        event-loop round trip between two namespaces took 390 us, 260 with this thread
        receiving itself).  A program's own looks still take what came when it calls."""
        wake = self.wake
        if wake.poller == "app":
            return True
        now = monotonic()
        if now - wake.app_polled < STANDBY:
            recent = True
        elif now - wake.app_looked < STANDBY:
            recent = not (wake.watched and self.ex.cq.pollers_receive)
        else:
            recent = False
        return recent and not self.ex.clc.watch and not self.ex.corked_any

    def _standby(self) -> bool:
        """The progress thread stands by (lock held on entry and on return): it lets go
        of the lock and asks for it again only after :data:`STANDBY` in which no
        application thread polled (while one polls, it looks after :data:`STANDBY_IDLE`,
        then ever more seldom), when woken (:meth:`Wakeups.wake_progress`), or when the
        CQ armed for it rings while no application thread polls (module doc).

        :returns: whether it ended at a look-in (its wait ran out, nobody woke or rang
            it): news found then came with nobody to hear it, and waited up to
            :data:`STANDBY` (the caller counts it: ``late_news_cnt``).

        Why not wait on a condition of the lock: its wait takes the lock back at each
        timeout, and an application thread that polls releases and takes the lock at
        every message; the waiter then sleeps and wakes once per release, losing the
        race each time (measured: 10 000 context switches a second, a streaming RoCE
        sender's every message, 64 KiB writes).
        """
        lock, wake, cq = self.ex.lock, self.wake, self.ex.cq
        wake_fd = wake.standby_r.fileno()
        idle = STANDBY_IDLE
        lock.release()
        try:
            while True:
                if wake.poller == "app":
                    timeout = idle
                    idle = min(2 * idle, STANDBY_LONGEST)
                else:
                    timeout = STANDBY
                    idle = STANDBY_IDLE
                woken = rung = False
                events = self._standby_poll.poll(timeout * 1000)
                for fd, _ in events:
                    if fd == wake_fd:
                        woken = True
                        try:
                            wake.standby_r.recv(4096)
                        except OSError:
                            pass
                    else:
                        rung = True
                        cq.clear_standby()
                # (read without the lock: a stale look only costs one more round; orphans
                # and closes that drain are looked at every STANDBY, _progress_step, or
                # at the look-ins while an application thread polls and takes their news)
                if (woken or (rung and wake.poller != "app") or not self.running
                        or self.closing.busy() or not self._standing_by()):  # fmt: skip
                    return not events
        finally:
            lock.acquire()

    def stop(self) -> bool:
        """End the progress thread (waits up to 2 s): whether it is gone."""
        self.running = False
        self.wake.kick()
        self.wake.wake_progress()
        self.thread.join(timeout=2.0)
        return not self.thread.is_alive()

    def close(self) -> None:
        """Close the pollers' epoll descriptors (the progress thread is gone)."""
        self._sleep_app.close()
        self._sleep_bg.close()
