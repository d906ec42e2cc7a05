"""How long a waiting thread watches the CQ before it sleeps: only where spinning pays.

A sleep costs a wake-up: on an idle host a cross-CPU wake-up of a halted virtual CPU
(tens of microseconds), so an answer that comes within microseconds is cheaper watched for
than slept for.  But a spinning thread holds a CPU: when the runnable threads of the host
outnumber its CPUs, the spin takes the very CPU the answer needs (the peer, or the thread
that would answer), and yielding between looks (``sched_yield``) is worse, handing the CPU
to a busy process for a whole time slice (milliseconds).  So (the wait-wake experiment in
the team's reference notes measured each scheme idle, under load and pinned):

* spin only while no more threads are runnable on the host than this process may use
  CPUs (``/proc/loadavg``'s running count, looked at every :data:`LOOK_EVERY` seconds, in
  two of the last three looks);
* with several CPUs, spin without yielding; with one (a process pinned to it), yield
  between looks, and only while the host runs no more than the waiter, its peer and one
  thread on each other CPU: a yield then hands the CPU to the peer whose answer is
  awaited, a turn without a sleep, a doorbell or a wake-up on either side (smcr bench
  pinned to one CPU: 42 us round trips this way, 70 us sleeping).  More runnable threads
  may mean a busy process on this very CPU, which a yield would hand a whole time slice:
  then no spin;
* never while other threads of the process wait for news that the spinning thread will
  hand them (they wait on their connections' conditions while it polls for everyone): a
  spin holds the GIL throughout (compiled code never offers it), so a thread it had just
  woken waited out the spin before it could run, message after message (two threads with
  a connection each: slowest round trip 17.5 ms, 1.2 without);
* spin for up to the caller's most; after :data:`MISSES` spins in a row
  that found nothing, pause spinning for a number of waits that doubles with each pause
  (up to :data:`MOST_PAUSE`), so that a connection whose answers come slowly (think time,
  an idle one) costs one spin in tens of waits, and one that answers fast again is found
  by the next spin;
* otherwise arm the CQ and sleep in the kernel, where the doorbell wakes this thread
  directly and the scheduler lets it preempt a busy process, as it does for TCP.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

from smcr.bound import monotonic

LOOK_EVERY: Final = 0.02
"""Seconds between looks at the host's runnable threads."""
LOOKS_MASK: Final = 0b111
CROWDED_LOOKS: Final = 2
"""Crowded when at least this many of the last three looks found more runnable threads than
CPUs: one look catches the transient (a kernel worker, another thread's brief work) as
often as the lasting (a busy process beside us), and a spin given up for a transient
costs a wake-up per wait for the next :data:`LOOK_EVERY`."""
MISSES: Final = 4
"""Spins in a row that found nothing before spinning pauses."""
MOST_PAUSE: Final = 64
"""The most waits a pause lasts; each pause after a miss is twice the last."""


def runnable_threads() -> int:
    """Threads runnable on the host now (the kernel's ``nr_running``, from ``/proc/loadavg``),
    or 0 when it cannot be read."""
    try:
        with open("/proc/loadavg", "rb") as f:
            fields = f.read().split()
        return int(fields[3].split(b"/")[0])
    except (OSError, IndexError, ValueError):
        return 0


class SpinPolicy:
    """One runtime's spinning (module docstring).

    :param most: the longest spin, seconds (``SMCR_SPIN_US``); 0 never spins.
    :param cpus: the CPUs this process may run on (default: its affinity's).
    :param runnable: how many threads are runnable on the host (default:
        :func:`runnable_threads`).
    """

    def __init__(self, most: float, cpus: int = 0,
                 runnable: Callable[[], int] = runnable_threads) -> None:  # fmt: skip
        self.most = most
        self.cpus = cpus or len(os.sched_getaffinity(0))
        self.runnable = runnable
        self.room = self.cpus if self.cpus >= 2 else (os.cpu_count() or 1) + 1
        """Runnable threads the host may have for a spin to pay: this process's CPUs; with one
        CPU, the waiter and its peer (who take turns on it) and one on each other CPU of
        the host."""
        self.yields = self.cpus < 2
        """Spin by yielding the CPU between looks (one CPU: the peer runs in the turns)."""
        self.crowded = False
        self.looks = 0
        """The last looks, a bit each (1: more runnable threads than CPUs), newest lowest."""
        self.next_look = 0.0
        self.misses = 0
        """Spins in a row that found nothing."""
        self.pause = 0
        """Waits to come that do not spin."""
        self.last_pause = 0

    def allowance(self, most: float, others_waiting: int = 0) -> float:
        """Seconds to spin now, at most ``most``: 0 while the host is crowded, while
        spinning pauses after spins that found nothing, or while ``others_waiting`` threads
        of the process wait for news the spinning thread will hand them."""
        if most <= 0.0 or others_waiting:
            return 0.0
        if self.pause:
            self.pause -= 1
            return 0.0
        now = monotonic()
        if now >= self.next_look:
            self.next_look = now + LOOK_EVERY
            self.looks = ((self.looks << 1) | (self.runnable() > self.room)) & LOOKS_MASK
            self.crowded = self.looks.bit_count() >= CROWDED_LOOKS
        return 0.0 if self.crowded else min(most, self.most)

    def spun(self, found: bool) -> None:
        """A spin found the news, or did not: after :data:`MISSES` in a row spinning pauses,
        for twice as many waits as the last pause (at most :data:`MOST_PAUSE`), and a
        spin that finds the news ends the pauses."""
        if found:
            self.misses = self.last_pause = 0
            return
        self.misses += 1
        if self.misses >= MISSES:
            self.misses = 0
            self.pause = self.last_pause = min(MOST_PAUSE, max(1, 2 * self.last_pause))
