"""The RNICs' event loop (:class:`smcr.rdma.eventloop.Engine`) after it stopped.

A stopped loop's descriptors are closed, and their numbers go to whatever the
process opens next: a wake-up written to the old bell's number would land there
(eight bytes into someone else's file, socket or shared memory).
"""

from __future__ import annotations

import os
import time

from smcr.rdma.eventloop import Engine


def test_a_timer_added_after_stop_writes_into_no_descriptor() -> None:
    engine = Engine("test-engine")
    engine.stop()
    r, w = os.pipe()  # takes the lowest free numbers: the closed bell's among them
    try:
        os.set_blocking(r, False)
        for _ in range(3):
            engine.call_at(time.monotonic(), lambda: None)
        assert _read_all(r) == b""
        os.write(w, b"ok")  # (the pipe works: the read above was not blind)
        assert _read_all(r) == b"ok"
    finally:
        os.close(r)
        os.close(w)


def test_stopping_twice_closes_nothing_of_anyone_else() -> None:
    engine = Engine("test-engine")
    engine.stop()
    r, w = os.pipe()
    try:
        engine.stop()
        os.fstat(r)  # both still open (EBADF otherwise)
        os.fstat(w)
    finally:
        os.close(r)
        os.close(w)


def _read_all(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""
