"""An idle connection costs nothing: a thread blocked in ``recv`` sleeps in the kernel (on the
CQ's descriptor), and the runtime's progress thread only looks in now and then."""

from __future__ import annotations

import threading
import time

from tests.socket.test_error_paths import pair

IDLE = 3.0
"""Seconds the connection stays idle while a thread waits in recv."""


def test_a_thread_blocked_in_recv_for_seconds_uses_under_one_percent_of_a_cpu() -> None:
    with pair("smc") as (a, b):
        a.settimeout(None)
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(a.recv(1)))
        reader.start()
        time.sleep(0.2)  # (the reader is asleep by now)
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(IDLE)
        used = (time.process_time() - cpu) / (time.monotonic() - wall)
        b.sendall(b"x")  # and it wakes for the byte
        reader.join(10)
        assert got == [b"x"]
        assert used < 0.01, f"{used:.2%} of a CPU while idle"
