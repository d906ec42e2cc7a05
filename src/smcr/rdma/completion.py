"""A completion queue with a descriptor to sleep on: the one every RNIC of smcr uses.

A thread-safe deque plus a doorbell socket pair: ``fileno()`` is a real descriptor for
``select``/``epoll``/asyncio, ``wait()`` sleeps on it.  A provider may register
*progress hooks* that ``poll`` runs first; the shm RNIC uses one to move arrived SENDs
from its shared ring into posted receives, so a receive costs the receiving thread one
wakeup and no engine-thread hop.  The providers' own CQs (:mod:`smcr.rdma.shm.cq`,
:mod:`smcr.rdma.roce.cq`) add how their peers see the arming.
"""

from __future__ import annotations

import select
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Final

from smcr import plainsock
from smcr.bound import get_ident, monotonic
from smcr.locks import give, take
from smcr.rdma import doorbell
from smcr.rdma.bells import WatchSlot
from smcr.rdma.verbs import WcOpcode, WcStatus, WorkCompletion

ARM_SLEEPER: Final = 1
"""A CQ armed for the thread asleep on :meth:`CompletionQueue.fileno` (its poller)."""
ARM_STANDBY: Final = 2
"""A CQ armed for the consumer's standby (:meth:`CompletionQueue.standby_fileno`): a
thread that stands by while no one polls, rung by news from peers only."""
ARM_PROGRESS: Final = 3
"""A CQ armed for the progress thread asleep on :meth:`CompletionQueue.fileno`: rung as
for :data:`ARM_SLEEPER`, except that a peer whose SEND is for a connection with an armed
consumer bell may ring that instead (:mod:`smcr.rdma.bells`): the thread that waits
for the connection then takes the news itself."""

DRAIN_EVERY: Final = 16
"""Arms after which a sleeper's arm drains an edge-signalled doorbell first
(:meth:`CompletionQueue.arming`): an arm of any target draws a ring or two (a peer's that
took the shared arm word, a local completion's that took the CQ's own; a requester too old
for the standby doorbell rings this one for a standby's arm), so a sleeper arms with a few
dozen bytes at most in the doorbell, far below the hundreds of one-byte writes that fill a
socket pair's buffer (a full one drops rings, which an edge-triggered sleeper would never
hear)."""

TAKEN_IN_PLACE: Final = WorkCompletion(wr_id=-1, status=WcStatus.SUCCESS,
                                       opcode=WcOpcode.RECV, qp_num=0)
"""Stands in the queue for SENDs that a QP's receiver took in place
(:meth:`QueuePair.set_receiver <smcr.rdma.base.QueuePair.set_receiver>`): one per
:meth:`CompletionQueue.poll` that took any, where their completions would have been, so
that the poll says there is news; the consumer skips it (it took the SENDs already)."""

SENDS_LOOKED: Final = 16
"""The most waiting completions :meth:`CompletionQueue.only_sends_wait` looks at (``_place.c``'s
``sends_only`` the same)."""


class CompletionQueue:
    """A completion queue with a pollable descriptor (``ibv_cq`` + ``ibv_comp_channel``).

    Why an *armed* flag: ``fileno()`` must be something a caller can sleep on,
    but signalling it on every local completion costs a syscall per WR; like
    ``ibv_req_notify_cq`` the CQ only signals for local completions once armed
    (:meth:`req_notify`, which :meth:`wait` calls).  A remote peer may ring the
    doorbell at any time (the shm RNIC does after a SEND, and only to a CQ armed
    this way: :mod:`smcr.rdma.shm.cq`); spurious wakeups are harmless, lost ones
    are not.

    Why a second descriptor, the *standby* one: a consumer whose pollers come and go (an
    application thread that polls while it waits in ``recv``, then waits elsewhere, say in
    ``select`` on a readiness descriptor) needs someone to hear the news that comes in
    between, without that someone waking for every message while a poller is there.  The
    standby thread sleeps on :meth:`standby_fileno`; arming the CQ for it
    (``req_notify(ARM_STANDBY)``) makes the next news *from a peer* ring it, and a poller
    that begins takes the arm back (:meth:`take_arm`).  Completions of the consumer's own
    posts (``push_many(local=True)``) do not ring it: the consumer made them, and the next
    news from a peer, or the poller, takes them.

    Why a unix socket pair and not an eventfd: a socket write wakes the sleeper
    with the scheduler's *sync* hint (the waker is about to sleep, so the woken
    task may take its CPU), an eventfd write does not.  On the loaded two-core
    reference host a SEND ping-pong between two processes went from about 670 µs
    to about 225 µs per round trip with this change alone.  ``MSG_NOSIGNAL``
    keeps a dead reader from raising SIGPIPE.
    """

    SPIN_SECONDS = 0.0

    edge_signals = True
    """Whether each signal of :meth:`fileno` is a new edge that an edge-triggered epoll
    reports (a ring is a byte written to the doorbell), so that a thread asleep on it that
    way need not drain it at each wake-up (:meth:`arming`).  Why: the drain was a system
    call per message at the receiving end where the receiver sleeps for every message (a
    32-byte blocking round trip beside a busy process: 7.9 -> 7.3 us of CPU per round trip
    at each end without it)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self._undrained = 0
        """Arms since the doorbell was last drained (:meth:`arming`)."""
        self.pollers_receive = False
        """Whether a thread asleep on :meth:`fileno` wakes for the provider's packets and its
        poll receives them (the RoCE RNIC: :mod:`smcr.rdma.roce.cq`), rather than being rung
        by a provider's thread that received them."""
        self._wcs: deque[WorkCompletion] = deque()
        self._lock = threading.Lock()
        self._armed = 0
        """0, :data:`ARM_SLEEPER` or :data:`ARM_STANDBY`: whom the next completion rings."""
        self._bell_r, self._bell_w = plainsock.nonblocking_pair()
        self._standby_r, self._standby_w = plainsock.nonblocking_pair()
        self._progress: list[Callable[[], None]] = []
        self.overruns = 0
        self.polling = 0
        """The thread whose :meth:`poll` runs the progress hooks now (0: none): a QP's
        receiver is called only there (:meth:`QueuePair.set_receiver
        <smcr.rdma.base.QueuePair.set_receiver>`), never from :meth:`has_completions`."""
        self.poster_looks = False
        """Set by a consumer thread around a post whose completions it takes itself right
        after (it holds the consumer's lock and looks once the post returns, if the queue
        is not :meth:`idle`): local completions pushed meanwhile ring nobody and leave the
        arm in place.  Why: the bytes of a request/response server's every 16th CDC
        completed at once on shm, and the ring for it woke the progress thread asleep on
        the CQ only to find the completion the sender would take, handing the lock and
        the GIL over twice (a third of its wake-ups at 1,000 connections).  (Under the
        GIL a push that saw the flag set came before the poster's look, which finds its
        completion; a poster that cannot look after all, its post having raised, calls
        :meth:`ring_held`.)"""

    def fileno(self) -> int:
        """The descriptor that becomes readable when completions may be waiting."""
        return self._bell_r.fileno()

    def doorbell_fd(self) -> int:
        """The write end of the doorbell: a provider passes it to peers that ring it.

        Ringing is writing one byte with ``MSG_NOSIGNAL | MSG_DONTWAIT``.
        """
        return self._bell_w.fileno()

    def standby_fileno(self) -> int:
        """The descriptor a CQ armed with :data:`ARM_STANDBY` makes readable (class doc)."""
        return self._standby_r.fileno()

    def standby_doorbell_fd(self) -> int:
        """The write end of the standby doorbell (:meth:`doorbell_fd`'s twin)."""
        return self._standby_w.fileno()

    def watch(self, token: int, rid: int) -> WatchSlot | None:
        """A consumer bell for the connection whose alert token is ``token`` and whose
        readiness descriptor is named by ``rid``, where the provider's peers can ring one
        (:mod:`smcr.rdma.bells`); None here."""
        return None

    def rings_by_name(self) -> bool:
        """Whether :meth:`watch` can give consumer bells here."""
        return False

    def unwatch(self, slot: WatchSlot) -> None:
        """Give back what :meth:`watch` gave."""

    def add_progress(self, hook: Callable[[], None]) -> None:
        """Register a provider hook that :meth:`poll` runs before it looks at the queue.

        The list is replaced, never changed in place: a poll running in another thread
        goes through the list it started with and skips no hook."""
        if hook not in self._progress:
            self._progress = [*self._progress, hook]

    def remove_progress(self, hook: Callable[[], None]) -> None:
        """Unregister a hook added with :meth:`add_progress`."""
        if hook in self._progress:
            self._progress = [h for h in self._progress if h != hook]

    def run_progress(self) -> None:
        """Run the provider's progress hooks (before :meth:`poll` looks at the queue)."""
        for hook in self._progress:
            hook()

    def push(self, wc: WorkCompletion, local: bool = False) -> None:
        """Add one completion (provider side); signals the descriptor if armed."""
        self.push_many((wc,), local=local)

    def push_many(self, wcs: Iterable[WorkCompletion], notify: bool = True,
                  local: bool = False) -> None:  # fmt: skip
        """Add completions in order; past ``depth`` they are counted as overruns and kept.

        Keeping them (instead of a CQ error as in verbs) is a deliberate softening:
        losing a completion would wedge the SMC-R slot accounting above.

        :param notify: signal an armed CQ; a progress hook running inside
            :meth:`poll` passes ``False``, since that poll returns them anyway
            and a self-signal would cost a syscall per message.
        :param local: completions of the consumer's own posts, made in the posting
            thread: they ring a poller, not a standby (class doc).
        """
        with self._lock:
            self._wcs.extend(wcs)
            if len(self._wcs) > self.depth:
                self.overruns += 1
            armed = self._armed if notify else 0
            if local and (armed == ARM_STANDBY or self.poster_looks):
                armed = 0
            if armed:
                self._armed = 0
        if armed:
            self._ring(armed)

    def ring_held(self) -> None:
        """Ring whom the arm names if completions wait: for a poster that set
        :attr:`poster_looks` and will not look (its post raised), so that what was pushed
        meanwhile without a ring is still taken; pushes ring again from now on."""
        self.poster_looks = False
        with self._lock:
            armed = self._armed if self._wcs else 0
            if armed:
                self._armed = 0
        if armed:
            self._ring(armed)

    def kick(self) -> None:
        """Make :meth:`fileno` readable (also callable from a provider's other threads)."""
        doorbell.ring(self._bell_w)  # (not gone: full, already readable, or closed)

    def kick_standby(self) -> None:
        """Make :meth:`standby_fileno` readable."""
        doorbell.ring(self._standby_w)

    def _ring(self, armed: int) -> None:
        """Ring whom ``armed`` names."""
        if armed == ARM_STANDBY:
            self.kick_standby()
        else:
            self.kick()

    def req_notify(self, target: int = ARM_SLEEPER) -> None:
        """Arm: the next completion signals the descriptor (``ibv_req_notify_cq``), or the
        standby descriptor for ``target`` :data:`ARM_STANDBY` (class doc)."""
        lock = self._lock
        take(lock)
        try:
            self._armed = target
            self._undrained += 1
        finally:  # (an interpreted build meets a KeyboardInterrupt anywhere)
            give(lock)

    def take_arm(self) -> int:
        """Disarm for a moment: the caller, which holds the consumer's lock, is about to post
        work whose completions come to this CQ and polls it itself right after (both ends
        of a connection in one process), so a thread asleep on :meth:`fileno` needs no
        signal for them -- ringing it would wake it only to find them taken, and hand the
        GIL over twice, once per message.  A poller that begins takes a standby's arm.

        :returns: the arm taken (0: none); if one, the caller arms it again when done
            (:meth:`req_notify`) and then looks once more: what a peer placed while it
            was disarmed (and so did not signal) is found by that look, as a sleeper's
            own arming finds it.
        """
        lock = self._lock
        take(lock)
        try:
            armed = self._armed
            self._armed = 0
        finally:
            give(lock)
        return armed

    def take_standby(self) -> bool:
        """Take a standby's arm, if armed so: a poller begins, and hears the news itself.

        :returns: whether it was armed so."""
        if self._armed == ARM_STANDBY:
            with self._lock:
                if self._armed == ARM_STANDBY:
                    self._armed = 0
                    return True
        return False

    def rearm_sleeper(self) -> None:
        """Arm for a sleeper unless armed already (a provider that drained the doorbell in a
        poll: the ring may have been meant for another thread asleep on :meth:`fileno`)."""
        with self._lock:
            if not self._armed:
                self._armed = ARM_SLEEPER

    def clear_signal(self) -> None:
        """Make :meth:`fileno` unreadable again after a sleep on it (the doorbell is drained;
        a provider whose descriptor is not the doorbell overrides this)."""
        doorbell.drain(self._bell_r)

    def arming(self) -> None:
        """A thread that sleeps on :meth:`fileno` edge-triggered (:attr:`edge_signals`) is
        about to arm the CQ for itself: after :data:`DRAIN_EVERY` arms of any target
        (:meth:`req_notify` counts them) the doorbell is drained, before the arm (a ring
        after it is a new edge).  Rings come only for arms (a ringer takes the arm it rings
        for), so the bytes never pile up before a sleeper's arm.  Drained only here: the
        thread about to sleep is the one poller, and a drain under a sleeper whose ring had
        come would take its wake-up."""
        if self._undrained >= DRAIN_EVERY:
            self._undrained = 0
            self.clear_signal()

    def clear_standby(self) -> None:
        """Make :meth:`standby_fileno` unreadable again."""
        doorbell.drain(self._standby_r)

    def waiting(self) -> None:
        """A thread that waits for this CQ (asleep on :meth:`fileno`, or watching it) is
        about to look: a provider whose pollers receive its packets leaves them to such a
        thread for a while (:mod:`smcr.rdma.roce.cq`); a poll that only looks, and then
        waits elsewhere, does not say so.  Nothing to do here."""

    def has_completions(self) -> bool:
        """Whether completions wait, after the provider's progress hooks ran; takes none.

        For a thread that spins on the CQ without holding its consumer's lock: it
        must not take completions that another thread, which holds that lock,
        would then handle before them.
        """
        self.run_progress()
        return bool(self._wcs)

    def has_news(self) -> bool:
        """Whether a :meth:`poll` now would find something: for a thread that looks before
        it polls (a spinner, a look after arming).  Here :meth:`has_completions`; a
        provider whose peers place messages where a poll's receiver can take them in place
        (shm) only looks, so that the poll that follows, with the consumer's lock held,
        takes them there rather than through receive completions."""
        return self.has_completions()

    def idle(self) -> bool:
        """Whether no completion waits in the queue."""
        return not self._wcs

    def only_sends_wait(self) -> bool:
        """Whether every completion waiting in the queue (none, or a few) is a send
        queue's WR's that succeeded.  A SEND a QP's receiver takes in place may go ahead of
        those (:meth:`QueuePair.set_receiver <smcr.rdma.base.QueuePair.set_receiver>`): no
        RNIC orders a QP's send completions against its receives (a real one reports them
        on two CQs, and a send's completion may come after the peer's answer to it), where
        a receive's or a failure's waiting comes first.  More than :data:`SENDS_LOOKED`: as if
        not (a look that long is not worth it)."""
        wcs = self._wcs
        if len(wcs) > SENDS_LOOKED:
            return False
        for wc in wcs:
            if wc.opcode & WcOpcode.RECV or wc.status is not WcStatus.SUCCESS:
                return False
        return True

    def poll(self, max_entries: int = 16) -> list[WorkCompletion]:
        """Take up to ``max_entries`` completions, oldest first, without blocking."""
        self.polling = get_ident()
        try:
            self.run_progress()
        finally:
            self.polling = 0
        if not self._wcs:  # (nothing to take: as the locked look would find, one step sooner)
            return []
        lock = self._lock
        take(lock)
        try:
            n = min(max_entries, len(self._wcs))
            out = [self._wcs.popleft() for _ in range(n)]
            # hooks push without signalling (we return what they made); if some are
            # left for another thread sleeping on this CQ, wake it now
            armed = self._armed if self._wcs else 0
            if armed:
                self._armed = 0
        finally:
            give(lock)
        if armed:
            self._ring(armed)
        return out

    def wait(self, timeout: float | None, max_entries: int = 16) -> list[WorkCompletion]:
        """Poll, spin for :attr:`SPIN_SECONDS`, then sleep on the descriptor until ``timeout``.

        Why the spin defaults to zero: measured on the 2-core reference host, a
        SEND ping-pong between two processes took 76 µs per round trip without
        spinning, 103 µs with a 20 µs spin and 238 µs with 100 µs: the doorbell's
        sync wakeup puts the peer on the waiter's CPU, and a spinning waiter
        keeps it from running.  Hosts with idle cores may set a spin.
        :returns: completions, or ``[]`` when ``timeout`` passed without any.
        """
        deadline = None if timeout is None else monotonic() + timeout
        spin_until = monotonic() + self.SPIN_SECONDS
        while True:
            self.waiting()
            wcs = self.poll(max_entries)
            if wcs:
                return wcs
            if monotonic() >= spin_until:
                break
        while True:
            self.req_notify()  # arm first, then look: a completion after the look rings
            self.waiting()
            wcs = self.poll(max_entries)
            if wcs:
                return wcs
            left = None if deadline is None else deadline - monotonic()
            if left is not None and left <= 0:
                return []
            if plainsock.ready(self.fileno(), timeout=left):
                # (drained only when rung: no exception on the common path)
                self.clear_signal()

    def close(self) -> None:
        """Release the descriptor; later use raises ``OSError``."""
        for end in (self._bell_r, self._bell_w, self._standby_r, self._standby_w):
            end.close()


class EpollCq(CompletionQueue):
    """A completion queue whose provider brings completions in from descriptors of its own
    (the RoCE RNIC's QP sockets, a verbs device's completion channels), in a progress hook
    run by whoever polls.

    * :meth:`fileno` is an epoll descriptor holding the doorbell and the provider's
      descriptors (:attr:`_ep`), so a thread asleep on the CQ wakes for either.
    * The hook asks it with no wait (:meth:`ready_now`), which drains the doorbell itself:
      a caller that cannot ``read`` the descriptor (reading an epoll fails; callers ignore
      that) never finds it readable for good.
    * Completions the hook pushes inside this CQ's own poll do not ring it: the poll that
      runs the hook returns them (the shm RNIC's rule, ``push_many(notify=False)``).
    """

    edge_signals = False
    """The provider's descriptors stay readable until its hook reads them: a sleeper must
    be told level-triggered."""

    def __init__(self, depth: int) -> None:
        super().__init__(depth)
        self._ep = select.epoll()
        self._bell_fd = self._bell_r.fileno()
        self._ep.register(self._bell_fd, select.EPOLLIN)
        self._hooks: dict[int, int] = {}
        """The threads running this CQ's hook now (:meth:`poll`, :meth:`has_completions`),
        by ident, with how deep (a hook may poll again): their pushes ring nobody.  A dict
        rather than a ``threading.local`` flag, whose every read and write from compiled
        code cost some 800 instructions (two writes per poll, a read per push)."""

    def fileno(self) -> int:
        """An epoll descriptor: readable when a completion may wait or one of the provider's
        descriptors is readable."""
        return self._ep.fileno()

    def clear_signal(self) -> None:
        """Nothing to do: :meth:`fileno` is an epoll descriptor (reading it fails), and the
        progress hook drains the doorbell when the next poll runs it."""

    def ready_now(self) -> list[int] | None:
        """The provider's descriptors readable now (the hook's look); the doorbell drained
        if it rang.  None once closed."""
        try:
            ready = doorbell.ready(self._ep)
        except (OSError, ValueError):
            return None
        out: list[int] = []
        for fd in ready:
            if fd != self._bell_fd:
                out.append(fd)
                continue
            doorbell.drain(self._bell_r)
            # the ring may have been meant for another thread asleep on this CQ: it would
            # have woken, found nothing and re-armed; re-arm for it, so the next completion
            # rings again (a spare wakeup is harmless, a lost one is not), unless armed
            # since (a standby's arm stays)
            self.rearm_sleeper()
        return out

    def push_many(self, wcs: Iterable[WorkCompletion], notify: bool = True,
                  local: bool = False) -> None:  # fmt: skip
        """As :meth:`CompletionQueue.push_many`, silent inside this CQ's own poll."""
        if notify and self._hooks and get_ident() in self._hooks:
            notify = False
        super().push_many(wcs, notify, local)

    def _hook_begins(self) -> int:
        """The calling thread runs the hook (:attr:`_hooks`): its ident, for :meth:`_hook_ends`."""
        ident = get_ident()
        hooks = self._hooks
        hooks[ident] = hooks.get(ident, 0) + 1  # (only this thread writes its own entry)
        return ident

    def _hook_ends(self, ident: int) -> None:
        hooks = self._hooks
        depth = hooks.pop(ident, 1) - 1
        if depth:
            hooks[ident] = depth

    def poll(self, max_entries: int = 16) -> list[WorkCompletion]:
        """Run the provider's hook (its pushes silent), then take up to ``max_entries``."""
        ident = self._hook_begins()
        try:
            return super().poll(max_entries)
        finally:
            self._hook_ends(ident)

    def has_completions(self) -> bool:
        """Run the provider's hook; whether completions wait (takes none)."""
        ident = self._hook_begins()
        try:
            return super().has_completions()
        finally:
            self._hook_ends(ident)

    def close(self) -> None:
        """Release the descriptors; later use raises ``OSError``."""
        self._ep.close()
        super().close()
