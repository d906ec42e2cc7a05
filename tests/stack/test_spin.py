"""When a waiting thread spins on the CQ (smcr.stack.spin): only while a CPU is free, and
less while spins find nothing."""

from __future__ import annotations

import time

from smcr.stack import spin
from smcr.stack.spin import SpinPolicy

MOST = 50e-6


def test_it_spins_while_a_cpu_is_free_and_not_while_the_host_is_crowded() -> None:
    runnable = [2]
    policy = SpinPolicy(MOST, cpus=2, runnable=lambda: runnable[0])
    assert policy.allowance(MOST) == MOST
    assert policy.allowance(10e-6) == 10e-6  # never longer than the caller's most
    runnable[0] = 3  # a busy process beside the two ends
    policy.next_look = 0.0
    assert policy.allowance(MOST) == MOST  # (one look: maybe a transient)
    policy.next_look = 0.0
    assert policy.allowance(MOST) == 0.0  # two of the last three: crowded
    runnable[0] = 1
    assert policy.allowance(MOST) == 0.0  # (looked at again only after LOOK_EVERY)
    time.sleep(spin.LOOK_EVERY)
    assert policy.allowance(MOST) == 0.0  # (still two of three)
    policy.next_look = 0.0
    assert policy.allowance(MOST) == MOST


def test_no_budget_never_spins() -> None:
    assert SpinPolicy(0.0, cpus=2, runnable=lambda: 1).allowance(MOST) == 0.0
    assert SpinPolicy(MOST, cpus=2, runnable=lambda: 1).allowance(0.0) == 0.0


def test_no_spin_while_other_threads_wait_for_the_news_this_one_hands_them() -> None:
    """A spin holds the GIL: threads that the spinner wakes through their conditions could
    not run until it ended (Progress passes how many wait: Wakeups.waiting)."""
    policy = SpinPolicy(MOST, cpus=2, runnable=lambda: 1)
    assert policy.allowance(MOST, others_waiting=1) == 0.0
    assert policy.allowance(MOST, others_waiting=7) == 0.0
    assert policy.allowance(MOST, others_waiting=0) == MOST
    assert policy.pause == policy.misses == 0  # (a wait that may not spin is no miss)


def test_one_cpu_yields_only_while_the_waiter_its_peer_and_the_other_cpus_run() -> None:
    runnable = [2]
    policy = SpinPolicy(MOST, cpus=1, runnable=lambda: runnable[0])
    policy.room = 3  # (a host of two CPUs: the pair on ours, one thread on the other)
    assert policy.yields
    assert policy.allowance(MOST) == MOST
    runnable[0] = 4  # anyone else may be on this CPU: a yield would hand it a time slice
    for _ in range(2):
        policy.next_look = 0.0
        policy.allowance(MOST)
    assert policy.crowded and policy.allowance(MOST) == 0.0
    assert not SpinPolicy(MOST, cpus=2, runnable=lambda: 1).yields


def test_spins_that_find_nothing_pause_spinning_for_longer_and_longer() -> None:
    policy = SpinPolicy(MOST, cpus=4, runnable=lambda: 1)
    skipped = []
    for _ in range(6):  # six rounds of MISSES empty spins, each followed by its pause
        for _ in range(spin.MISSES):
            assert policy.allowance(MOST) == MOST
            policy.spun(False)
        n = 0
        while policy.allowance(MOST) == 0.0:
            n += 1
        skipped.append(n)
    assert skipped == [1, 2, 4, 8, 16, 32]
    for _ in range(3 * spin.MISSES):  # and no longer than MOST_PAUSE
        while policy.allowance(MOST) == 0.0:
            pass
        policy.spun(False)
    assert policy.pause <= policy.last_pause == spin.MOST_PAUSE


def test_a_spin_that_finds_the_news_ends_the_pauses() -> None:
    policy = SpinPolicy(MOST, cpus=4, runnable=lambda: 1)
    for _ in range(3 * spin.MISSES):
        while policy.allowance(MOST) == 0.0:
            pass
        policy.spun(False)
    assert policy.last_pause > 1
    while policy.allowance(MOST) == 0.0:
        pass
    policy.spun(True)
    for _ in range(spin.MISSES - 1):
        assert policy.allowance(MOST) == MOST  # no pause any more
        policy.spun(False)
    assert policy.allowance(MOST) == MOST
    policy.spun(False)
    assert policy.allowance(MOST) == 0.0 and policy.last_pause == 1  # pauses start over


def test_the_host_count_reads_proc_loadavg() -> None:
    assert spin.runnable_threads() >= 1  # (this thread runs)
