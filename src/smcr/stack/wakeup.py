"""Who polls a runtime's CQ now, and how to wake that thread.

One thread at a time sleeps on the CQ for everyone: an application thread blocked in a
call (:mod:`smcr.stack.progress`, "whoever waits, polls"), or the runtime's progress
thread when none does.  Whoever changes what a sleeping poller must watch (a new
deadline, a new descriptor) rings its doorbell; the progress thread also has a standby
bell of its own.  This module holds that state and the two bells, and nothing else, so
that every part of the runtime can ring them.
"""

from __future__ import annotations

import _socket

from smcr import plainsock
from smcr.bound import get_ident
from smcr.rdma import doorbell


class Wakeups:
    """The poller role and the doorbells of one runtime (module docstring)."""

    def __init__(self) -> None:
        self.poller: str | None = None
        """``"app"``: an application thread polls; ``"bg"``: the progress thread; None."""
        self.poller_ident = 0
        """The thread ident of the application thread that polls."""
        self.app_polled = 0.0
        """When an application thread last polled: waited in a call of its own (monotonic)."""
        self.app_looked = 0.0
        """When an application thread last took the news in a call that does not wait (a
        send over an RNIC without inline sends: :meth:`DataPath.send_fast
        <smcr.stack.conn.DataPath.send_fast>`)."""
        self.watched = False
        """The program has watched a connection's readiness descriptor (``fileno()``, for
        ``select``, ``poll``, an event loop): from then on news that comes between two
        polls of its threads is heard at once (:meth:`Progress.standby_needed
        <smcr.stack.progress.Progress.standby_needed>`)."""
        self.waiting = 0
        """Application threads waiting on a connection's condition while another one polls
        (:meth:`Progress.wait <smcr.stack.progress.Progress.wait>`): the poller's news is
        theirs too, so the CQ stays armed for the standby when it stops polling."""
        self.send_takes_standby = False
        """The next send takes the CQ's standby arm over while it posts, if it is armed so
        (:meth:`Progress.send_ended <smcr.stack.progress.Progress.send_ended>`): an
        application thread handed the CQ to the standby, or read (a send after a read is a
        request after an answer, whose answer may come at once).  The sends after it
        leave the arm: a stream's sender would pay a disarm and a look per message."""
        self.standby_r, self.standby_w = _doorbell()
        """Rung by :meth:`wake_progress`: the progress thread's standby ends."""
        # a full doorbell already means a wake-up is pending: kick() must never block (it
        # is called with the lock held, and the poller it wakes needs the lock to drain it)
        self.bell_r, self.bell_w = _doorbell()
        """The application pollers' doorbell."""
        self.bg_bell_r, self.bg_bell_w = _doorbell()
        """The progress thread's own, for when it polls: were it to share the application
        pollers', whichever drained it first would leave the other asleep on it."""

    def app_polls_elsewhere(self) -> bool:
        """Whether an application thread other than the calling one polls (and so may sleep
        on a doorbell the caller drained, or on the CQ rather than its condition)."""
        return self.poller == "app" and self.poller_ident != get_ident()

    def kick(self) -> None:
        """Wake a sleeping poller (to re-check for a new deadline).

        Never blocks: a full doorbell (kicks faster than a poller drains them) already
        wakes the poller.  Blocking there, the kicker held the runtime's lock while the
        poller that would drain the bell waited for that lock: every thread of the
        process stopped (asyncio's test_ssl, TLS over TLS with ten client threads).

        The doorbells are rung (and drained) in C, which keeps the GIL: a socket method
        lets it go for the system call, and the kicker, which holds the runtime's lock,
        then waited for the GIL with the lock held, while a thread that took the GIL
        meanwhile found the lock taken and slept on it (perf of eight client threads
        showed such sleeps behind ``kick``)."""
        doorbell.ring(self.bg_bell_w if self.poller == "bg" else self.bell_w)

    def kick_progress(self) -> None:
        """Wake the progress thread if it sleeps on the CQ (an application thread takes the
        poller's role from it: two threads asleep on one CQ would race for its doorbell,
        the loser sleeping on with the CQ no longer armed)."""
        doorbell.ring(self.bg_bell_w)

    def bell(self, progress: bool) -> _socket.socket:
        """The doorbell a poller sleeps on: the progress thread's, or the applications'."""
        return self.bg_bell_r if progress else self.bell_r

    def wake_poller(self) -> None:
        """:meth:`kick`, unless the calling thread is the application thread that polls
        (it looks again when its poll returns; a ring would cost it a wasted round)."""
        if self.poller != "app" or self.poller_ident != get_ident():
            self.kick()

    def wake_progress(self) -> None:
        """End the progress thread's standby now: there is work an application thread that
        polls would not do (lock held or not)."""
        doorbell.ring(self.standby_w)

    def set_poller(self, who: str | None) -> None:
        """A method, not an assignment in place: mypyc would take the attribute for the
        narrowed ``str`` in a ``finally`` after it, where another thread may have reset
        it to None meanwhile (the lock is released while polling): TypeError."""
        self.poller = who

    def close(self) -> None:
        """Close the doorbells (the progress thread is gone)."""
        for end in (self.bell_r, self.bell_w, self.bg_bell_r, self.bg_bell_w, self.standby_r,
                    self.standby_w):  # fmt: skip
            end.close()


def _doorbell() -> tuple[_socket.socket, _socket.socket]:
    """A doorbell: a socket pair, both ends non-blocking."""
    return plainsock.nonblocking_pair()
