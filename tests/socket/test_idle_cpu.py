"""An idle connection costs nothing: a thread blocked in ``recv`` sleeps in the kernel (on the
CQ's descriptor), and the runtime's progress thread only looks in now and then.

Both what it costs (CPU time) and why (wake-ups: each costs about a millisecond of CPU
on a virtual machine of the kind CI runs on, so ten a second are already 1%)."""

from __future__ import annotations

import os
import threading
import time

from tests.socket.test_error_paths import pair

IDLE = 3.0
"""Seconds the connection stays idle while a thread waits in recv."""
WAKEUPS_PER_SECOND = 5
"""The most times a second the process's threads may wake up meanwhile, all together."""


def _wakeups() -> int:
    """How often this process's threads have gone to sleep so far (and so been woken)."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                total += next(int(line.split()[1]) for line in f
                              if line.startswith("voluntary_ctxt_switches"))  # fmt: skip
        except (OSError, StopIteration):
            pass  # (a thread that ended meanwhile)
    return total


def test_a_thread_blocked_in_recv_for_seconds_uses_under_one_percent_of_a_cpu() -> None:
    with pair("smc") as (a, b):
        a.settimeout(None)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(a.recv(1)))
        reader.start()
        time.sleep(0.2)  # (the reader is asleep by now)
        cpu, wall, woken = time.process_time(), time.monotonic(), _wakeups()
        time.sleep(IDLE)
        wakeups = _wakeups() - woken - 1  # (the main thread's sleep)
        used = (time.process_time() - cpu) / (time.monotonic() - wall)
        b.sendall(b"x")  # and it wakes for the byte
        reader.join(10)
        assert got == [b"x"]
        assert wakeups <= WAKEUPS_PER_SECOND * IDLE, f"{wakeups} wake-ups in {IDLE} s idle"
        assert used < 0.01, f"{used:.2%} of a CPU while idle"
