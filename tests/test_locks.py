"""smcr.locks: a lock taken and given back in C is the very lock Python's methods see.

Each test runs with the C calls (where the build has them: a compiled build always does,
and CI builds it) and with the Python ones they stand for.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from smcr import locks, native


@dataclass(frozen=True)
class Calls:
    take: Callable[[Any], None]
    try_take: Callable[[Any], bool]
    give: Callable[[Any], None]


@pytest.fixture(params=["c", "python"])
def calls(request: pytest.FixtureRequest) -> Iterator[Calls]:
    if request.param == "c":
        c = locks.C_CALLS
        if c is None:
            assert not native.status().compiled  # (a compiled build always has them)
            pytest.skip("a pure-Python build has no C calls")
        assert (locks.take, locks.try_take, locks.give) == (c.take, c.try_take, c.give)
        yield Calls(c.take, c.try_take, c.give)
    else:
        yield Calls(locks._py_take, locks._py_try_take, locks._py_give)


def test_a_lock_taken_is_held_for_python_and_given_back_is_free(calls: Calls) -> None:
    lock = threading.Lock()
    calls.take(lock)
    assert lock.locked()
    assert not lock.acquire(False)
    assert not calls.try_take(lock)
    calls.give(lock)
    assert not lock.locked()
    assert calls.try_take(lock)
    assert lock.locked()
    lock.release()  # (Python's release of a lock taken here)
    with lock:  # (and Python's own take, given back by it)
        assert not calls.try_take(lock)
    assert calls.try_take(lock)
    calls.give(lock)


def test_giving_back_a_free_lock_is_the_error_release_gives(calls: Calls) -> None:
    lock = threading.Lock()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        calls.give(lock)
    assert calls.try_take(lock)  # (and the lock still works)
    calls.give(lock)


def test_a_held_lock_is_waited_for_until_its_holder_gives_it_back(calls: Calls) -> None:
    lock = threading.Lock()
    lock.acquire()
    order: list[str] = []

    def taker() -> None:
        calls.take(lock)
        order.append("taken")
        calls.give(lock)

    t = threading.Thread(target=taker)
    t.start()
    time.sleep(0.05)
    order.append("given")  # (the taker is blocked: nothing of it ran yet)
    lock.release()
    t.join(5)
    assert order == ["given", "taken"]
    assert not lock.locked()


def test_an_rlock_is_reentrant_and_owned_by_the_thread_that_took_it(calls: Calls) -> None:
    rlock: Any = threading.RLock()
    calls.take(rlock)
    assert calls.try_take(rlock)  # (reentrant)
    calls.take(rlock)
    assert rlock._is_owned()
    seen: list[object] = []

    def other() -> None:
        seen.append(calls.try_take(rlock))
        try:
            calls.give(rlock)
        except RuntimeError as e:
            seen.append(str(e))

    t = threading.Thread(target=other)
    t.start()
    t.join(5)
    assert seen == [False, "cannot release un-acquired lock"]
    state = rlock._release_save()  # (what a Condition over it does while it waits)
    assert state == (3, threading.get_ident())
    rlock._acquire_restore(state)
    for _ in range(3):
        calls.give(rlock)
    assert not rlock._is_owned()
    with pytest.raises(RuntimeError, match="cannot release un-acquired lock"):
        calls.give(rlock)
    t = threading.Thread(target=lambda: seen.append(rlock.acquire(False) and rlock.release()))
    t.start()
    t.join(5)
    assert seen[-1] is None  # (free for another thread: acquired, then released)


def test_other_locks_go_through_their_methods(calls: Calls) -> None:
    class Counting:
        def __init__(self) -> None:
            self.calls: list[tuple[str, tuple[object, ...]]] = []

        def acquire(self, *args: object) -> bool:
            self.calls.append(("acquire", args))
            return False

        def release(self) -> None:
            self.calls.append(("release", ()))

    lock = Counting()
    calls.take(lock)
    assert not calls.try_take(lock)
    calls.give(lock)
    assert lock.calls == [("acquire", ()), ("acquire", (False,)), ("release", ())]


@pytest.mark.parametrize("kind", [threading.Lock, threading.RLock])
def test_threads_that_mix_the_calls_and_the_methods_exclude_each_other(
        calls: Calls, kind: Callable[[], Any]) -> None:  # fmt: skip
    lock = kind()
    cond = threading.Condition(lock)
    count = [0]
    rounds = 20_000

    def direct() -> None:
        for _ in range(rounds):
            calls.take(lock)
            value = count[0]
            count[0] = value + 1
            cond.notify_all()  # (a Condition over the lock sees it held: no RuntimeError)
            calls.give(lock)

    def methods() -> None:
        for _ in range(rounds):
            with lock:
                value = count[0]
                count[0] = value + 1

    def polite() -> None:
        for _ in range(rounds):
            while not calls.try_take(lock):
                pass
            value = count[0]
            count[0] = value + 1
            calls.give(lock)

    threads = [threading.Thread(target=f) for f in (direct, methods, polite, direct)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert count[0] == 4 * rounds
    assert calls.try_take(lock)  # (free again)
    calls.give(lock)


@pytest.mark.parametrize("kind", [threading.Lock, threading.RLock])
def test_a_condition_over_the_lock_waits_and_wakes_as_before(
        calls: Calls, kind: Callable[[], Any]) -> None:  # fmt: skip
    lock = kind()
    cond = threading.Condition(lock)
    seen: list[int] = []

    def waiter() -> None:
        calls.take(lock)
        try:
            while not seen:
                cond.wait(5)  # (gives the lock up while it sleeps, takes it back)
            seen.append(2)
        finally:
            calls.give(lock)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    calls.take(lock)
    seen.append(1)
    cond.notify()
    calls.give(lock)
    t.join(5)
    assert seen == [1, 2]
    assert calls.try_take(lock)  # (free again)
    calls.give(lock)


def test_a_signal_ends_a_wait_for_a_held_lock_with_its_handlers_error(calls: Calls) -> None:
    """A blocked take is interruptible as Python's acquire is: a signal handler's exception
    comes out of it, and the lock is left as it was (held by its holder)."""
    lock = threading.Lock()
    lock.acquire()

    class AlarmError(Exception):
        pass

    def alarm(signum: int, frame: object) -> None:
        raise AlarmError

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(AlarmError):
            calls.take(lock)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert lock.locked()
    lock.release()
    assert calls.try_take(lock)
    calls.give(lock)
