"""The progress thread of an RNIC: the part that works on its own, for every provider.

Design: the data path runs in the caller's thread (the shm RNIC's ``post_send``
copies straight into the peer's memory and its ``poll`` moves arrived SENDs into
receives; the RoCE RNIC sends and drains its sockets where it can), because a
thread hop would double the latency.  What must happen while the application
sleeps or computes lives here, in one daemon thread per device (the shm RNIC has a
second one for its rendezvous server):

* reading what arrives on a descriptor (shm: rendezvous connections, QP hellos, MR
  look-ups; RoCE: the UDP sockets, packets the application is not polling for);
* noticing a peer's death (EOF/HUP on a connection, which the kernel delivers
  at once even after SIGKILL) and moving the QPs to ERR;
* timers: RNR and retransmit retries, the RoCE RNIC's socket reclaim.

It is an ``epoll`` loop over registered descriptors plus a heap of deadlines; a
doorbell eventfd wakes it when another thread adds a timer or stops it.  Handler
faults are logged and survived: one bad peer must not stop the RNIC for all.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import select
import threading
from collections.abc import Callable
from typing import Final, Protocol

from smcr.bound import monotonic
from smcr.osthreads import NamedThread
from smcr.rdma.verbs import AsyncEvent, PathMtu

log = logging.getLogger(__name__)

#: The timer heap holds ``(deadline, sequence number, Timer)``: these name the ends.
_DEADLINE: Final = 0
_TIMER: Final = 2


class Timer:
    """A scheduled call; :meth:`cancel` makes it a no-op."""

    __slots__ = ("cancelled", "deadline", "fn")

    def __init__(self, deadline: float, fn: Callable[[], None]) -> None:
        self.deadline = deadline
        self.fn = fn
        self.cancelled = False

    def fire(self, _events: int) -> None:
        """Run the call (the engine's handler signature)."""
        self.fn()

    def cancel(self) -> None:
        """Do not run (safe to call from any thread, any number of times)."""
        self.cancelled = True


class Engine:
    """An epoll loop with timers in a daemon thread.

    :param name: thread name, for debugging.
    """

    def __init__(self, name: str) -> None:
        self._epoll = select.epoll()
        self._bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._handlers: dict[int, Callable[[int], None]] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._running = True
        self._epoll.register(self._bell, select.EPOLLIN)
        self._worker = NamedThread(target=self._run, name=name, daemon=True)
        self._worker.start()

    def in_engine(self) -> bool:
        """Whether the caller runs on the engine thread."""
        return threading.current_thread() is self._worker

    def watch(self, fd: int, handler: Callable[[int], None]) -> None:
        """Call ``handler(events)`` in the engine when ``fd`` is readable or hung up."""
        with self._lock:
            self._handlers[fd] = handler
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)

    def unwatch(self, fd: int) -> None:
        """Stop watching ``fd`` (before the caller closes it)."""
        with self._lock:
            if self._handlers.pop(fd, None) is not None:
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)

    def call_at(self, deadline: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn`` in the engine at ``deadline`` (``time.monotonic()`` seconds)."""
        timer = Timer(deadline, fn)
        with self._lock:
            heapq.heappush(self._timers, (deadline, next(self._seq), timer))
            if self._timers[0][_TIMER] is timer and not self.in_engine():
                self._ring()
        return timer

    def _ring(self) -> None:
        """Wake the thread (lock held: :meth:`stop` closes the bell under it, and a write
        to its number afterwards would land in whatever descriptor took the number)."""
        if self._bell >= 0:
            with contextlib.suppress(OSError):
                os.eventfd_write(self._bell, 1)

    def stop(self) -> None:
        """Stop the thread, wait for it (bounded), and release the loop's descriptors
        (once: a second call does nothing)."""
        self._running = False
        if not self.in_engine():
            with self._lock:
                self._ring()
            self._worker.join(timeout=5.0)
        with self._lock:
            self._epoll.close()
            if self._bell >= 0:
                os.close(self._bell)
                self._bell = -1

    def _next_timeout(self) -> float:
        with self._lock:
            while self._timers and self._timers[0][_TIMER].cancelled:
                heapq.heappop(self._timers)
            if not self._timers:
                return -1.0
            return max(0.0, self._timers[0][_DEADLINE] - monotonic())

    def _due(self) -> list[Timer]:
        now = monotonic()
        due: list[Timer] = []
        with self._lock:
            while self._timers and self._timers[0][_DEADLINE] <= now:
                due.append(heapq.heappop(self._timers)[_TIMER])
        return [t for t in due if not t.cancelled]

    def _run(self) -> None:
        while self._running:
            try:
                events = self._epoll.poll(self._next_timeout())
            except OSError:
                return  # the loop was closed under us: stop() is in progress
            for fd, mask in events:
                if self._bell < 0:
                    return  # stop() closed the descriptors these name (its wait timed out)
                if fd == self._bell:
                    with contextlib.suppress(OSError):
                        os.eventfd_read(fd)
                    continue
                handler = self._handlers.get(fd)
                if handler is not None:
                    self._safely(handler, mask)
            for timer in self._due():
                self._safely(timer.fire, 0)

    @staticmethod
    def _safely(fn: Callable[[int], None], arg: int) -> None:
        """Run one handler; a fault is logged, not allowed to end the thread."""
        try:
            fn(arg)
        except Exception:  # the engine must outlive any one faulty peer or handler
            log.exception("RNIC event loop handler failed")


class QpDevice(Protocol):
    """What a software RNIC's QP asks of its device, whichever RNIC (the shm and RoCE QPs
    extend it): the device modules make QPs, and an import back from a QP's module would
    close a circle.  Nothing here is asked per packet."""

    @property
    def engine(self) -> Engine:
        """The device's event loop (the QPs' timers and watched sockets)."""

    @property
    def max_mtu(self) -> PathMtu:
        """The path MTU the device allows."""

    def forget_qp(self, qpn: int) -> None:
        """The QP is destroyed: the device lets go of it."""

    def post_async_event(self, event: AsyncEvent) -> None:
        """Report an asynchronous event (a fatal QP error)."""
