"""The lane's wait for a blocking read (``_lane.c``'s ``wait_readable``, :mod:`smcr.stack.waiter`):
what :meth:`DataPath.read_waiting <smcr.stack.conn.DataPath.read_waiting>` waits with where
no spin is allowed (a crowded host; here the reader's spin policy is set to never spin).

Two runtimes of this process (hosts: to each other, other machines) joined by a connection
each way; readers block in ``read_waiting`` as a blocking ``recv_into`` does.  The wait must
miss no wake-up (the arm, the look after it, the sleep), end with the bytes, an EOF or a
signal handler's exception, and leave the poller's role and the runtime's lock as it found
them.  The compiled build serves the lane (CI builds it: there a skip fails).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from smcr import nativebuild
from smcr.stack import progress, waiter
from smcr.stack.conn import DataPath
from smcr.stack.runtime import Stack
from tests.stack.hosts import conn, connect, hosts


class Waits:
    """``waiter.WAIT_READABLE`` counted: how often the lane waited (True), or declined."""

    def __init__(self, wait: Callable[[Any, Any, int], bool]) -> None:
        self.wait = wait
        self.calls = self.waited = self.declined = 0

    def __call__(self, path: Any, c: Any, need: int) -> bool:
        self.calls += 1
        done = self.wait(path, c, need)
        if done:
            self.waited += 1
        else:
            self.declined += 1
        return done


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> Waits:
    if waiter.WAIT_READABLE is None:
        pytest.skip("the compiled build serves the lane")
    counted = Waits(waiter.WAIT_READABLE)
    monkeypatch.setattr(waiter, "WAIT_READABLE", counted)
    return counted


class End:
    """One runtime's end of a connection to another runtime, as a blocking socket uses it."""

    def __init__(self, stack: Stack, hc: Any) -> None:
        hc.local_peer = False  # (another runtime's: its completions are not taken at the read)
        self.stack, self.hc = stack, hc
        self.path = DataPath(stack, hc)
        stack.progress.spin.most = 0.0  # never spins: the lane's case

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        deadline = time.monotonic() + 10
        while view:
            n = self.path.try_send(view)
            if n > 0:
                view = view[n:]
            else:
                assert time.monotonic() < deadline, "no room within 10 s"
                time.sleep(0.0005)

    def read(self, n: int, waitall: bool = True) -> bytes:
        out = bytearray(n)
        got = self.path.read_waiting(memoryview(out), waitall)
        assert got > 0, got
        return bytes(out[:got])

    def idle(self) -> bool:
        """No application thread polls, and the runtime's lock is free (the wait left them
        so; the progress thread may poll: a long wait hands it the CQ)."""
        free = self.stack.ex.lock.acquire(timeout=5)
        if free:
            self.stack.ex.lock.release()
        return free and self.stack.ex.wake.poller != "app"


@pytest.fixture
def pair() -> Iterator[tuple[End, End]]:
    with hosts(2) as (a, b):
        hc_a, hc_b = connect(a, b)
        yield End(a, hc_a), End(b, hc_b)


def later(seconds: float, act: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        act()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_read_blocked_in_the_lane_gets_bytes_that_come_later(
        pair: tuple[End, End], waits: Waits) -> None:  # fmt: skip
    """The reader arms, looks, finds nothing and sleeps; the writer's message rings it."""
    a, b = pair
    for pause in (0.0, 0.001, 0.05, 0.3):
        writer = later(pause, lambda: a.send(b"answer"))
        assert b.read(6) == b"answer"
        writer.join(5)
    assert waits.waited >= 3 and waits.declined == 0, vars(waits)
    assert b.idle()


def test_round_trips_through_the_lane_lose_no_wake_up(pair: tuple[End, End],
                                                      waits: Waits) -> None:  # fmt: skip
    """Both ends block in the lane's wait, round after round, messages of varied sizes,
    the answering end now and then pausing (so that the asker sleeps before it comes): every
    byte arrives, in order, within a deadline a missed wake-up would overrun."""
    a, b = pair
    rounds, rng = 2000, random.Random(7)
    sizes = [rng.choice([1, 32, 100, 1000, 4000]) for _ in range(rounds)]
    pauses = [rng.random() < 0.05 for _ in range(rounds)]
    failed: list[BaseException] = []

    def answer() -> None:
        try:
            for size, pause in zip(sizes, pauses, strict=True):
                data = b.read(size)
                if pause:
                    time.sleep(0.002)
                b.send(data[::-1])
        except BaseException as exc:  # (reported by the test's thread)
            failed.append(exc)

    answerer = threading.Thread(target=answer, daemon=True)
    answerer.start()
    began = time.monotonic()
    for i, size in enumerate(sizes):
        data = rng.randbytes(size)
        a.send(data)
        assert a.read(size) == data[::-1], i
    answerer.join(30)
    assert not failed, failed
    assert time.monotonic() - began < 60
    assert waits.waited >= rounds // 2, vars(waits)
    assert a.idle() and b.idle()


def test_a_read_blocked_in_the_lane_sees_the_peers_close(pair: tuple[End, End],
                                                         waits: Waits) -> None:  # fmt: skip
    """The peer closes while the reader sleeps in the lane: the wait ends (EOF), readable."""
    a, b = pair
    closer = later(0.1, lambda: a.path.close(None))
    out = memoryview(bytearray(10))
    assert b.path.read_waiting(out, True) <= 0  # (not the fast read's case: EOF)
    closer.join(5)
    c = conn(b.stack, b.hc)
    assert c.peer_done
    assert waits.waited >= 1, vars(waits)
    assert b.idle()


class HandlerError(Exception):
    pass


def test_a_signal_handlers_exception_ends_the_lane_wait_cleanly(pair: tuple[End, End],
                                                                waits: Waits) -> None:  # fmt: skip
    """A signal handler raises while the reader sleeps in the lane (its ``epoll_wait`` is
    interrupted): the exception comes out of the read, the poller's role is given up and the
    runtime's lock free, and the next read gets its bytes."""
    a, b = pair

    def handler(signum: int, frame: object) -> None:
        raise HandlerError

    old = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        began = time.monotonic()
        with pytest.raises(HandlerError):
            b.read(4)
        assert time.monotonic() - began < 3
        assert waits.calls == 1 and waits.waited == waits.declined == 0  # (raised in it)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert b.idle()
    writer = later(0.05, lambda: a.send(b"next"))
    assert b.read(4) == b"next"
    writer.join(5)
    assert b.idle()


def test_the_lane_declines_a_wait_that_may_spin(pair: tuple[End, End], waits: Waits) -> None:
    """Where the spin policy allows a spin the Python waits (and spins): the lane says so
    before it takes the poller's role or arms anything."""
    if progress.SPIN <= 0.0:
        pytest.skip("SMCR_SPIN_US=0: no wait may spin, so the lane declines none")
    a, b = pair
    b.stack.progress.spin.most = 0.001
    b.stack.progress.spin.crowded = False
    b.stack.progress.spin.pause = 0
    b.stack.progress.spin.next_look = time.monotonic() + 60  # (no look at the host's load)
    c = conn(b.stack, b.hc)
    with b.stack.ex.lock:
        poller = b.stack.ex.wake.poller
        assert not waits.wait(b.path, c, 1)
        assert b.stack.ex.wake.poller == poller
    writer = later(0.05, lambda: a.send(b"spun"))
    assert b.read(4) == b"spun"
    writer.join(5)
    assert waits.waited == 0 and waits.declined >= 1, vars(waits)


def test_the_waiter_looks_for_the_library_the_build_makes() -> None:
    """The lane's wait finds the compiled methods in mypyc's shared library by the build's
    name for it: the two names must agree, or a compiled process waits in Python."""
    assert waiter.GROUP == nativebuild.GROUP
