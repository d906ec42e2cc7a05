"""A busy host on demand: CPU-bound competitor processes, and both ends of a benchmark pinned.

``smcr bench --load N`` starts N processes that do nothing but compute (``while True:
pass``, at nice 0, on any CPU) for the whole run, so that SMC-R and TCP are measured under
the same contention; ``--cpus LIST`` pins both ends of the benchmark to those CPUs (the
peer inherits this process's affinity).  Real servers are never idle: a transport that
wins only on an idle host is not one an operator can turn on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def competitors(count: int) -> Iterator[list[int]]:
    """``count`` CPU-bound processes for the duration (their pids); killed at the end."""
    command = [sys.executable, "-c", BUSY_LOOP]
    procs = [subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
             for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGKILL)
            p.wait()


def parse_cpus(text: str) -> set[int]:
    """A CPU list as ``taskset -c`` takes it (``0``, ``0,1``, ``0-3,6``).

    :raises ValueError: for anything else, or a CPU this process may not run on.
    """
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"--cpus {text!r}: expected a list such as 0 or 0,1 or 0-3")
        cpus.update(range(int(lo), int(hi if dash else lo) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise ValueError(f"--cpus {text!r}: this host's CPUs are {sorted(allowed)}")
    return cpus


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """This process (and the processes it starts meanwhile) on ``cpus``; as before after."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
