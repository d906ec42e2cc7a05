"""An EpollCq's rule for completions its own hook pushes: they ring nobody (the poll that
runs the hook returns them), while the same CQ's other threads' pushes ring as always."""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator

import pytest

from smcr.rdma.completion import ARM_SLEEPER, EpollCq
from smcr.rdma.verbs import WcOpcode, WcStatus, WorkCompletion


def _wc(wr_id: int) -> WorkCompletion:
    return WorkCompletion(wr_id=wr_id, status=WcStatus.SUCCESS, opcode=WcOpcode.RECV, qp_num=1)


def _rung(cq: EpollCq) -> bool:
    """Whether the CQ's descriptor (an epoll holding its doorbell) is readable: rung."""
    return bool(select.select([cq.fileno()], [], [], 0)[0])


@pytest.fixture
def cq() -> Iterator[EpollCq]:
    q = EpollCq(16)
    yield q
    q.close()


def test_pushes_of_the_hook_inside_a_poll_ring_nobody_and_the_arm_stays(cq: EpollCq) -> None:
    pushed: list[int] = []

    def hook() -> None:
        if not pushed:
            pushed.append(1)
            cq.push(_wc(1))

    cq.add_progress(hook)
    cq.req_notify(ARM_SLEEPER)
    assert [wc.wr_id for wc in cq.poll(4)] == [1]
    assert not _rung(cq)
    cq.push(_wc(2))  # (outside any poll: the arm the hook's push left rings now)
    assert _rung(cq)


def test_a_hook_that_runs_the_hook_again_stays_silent_after_the_inner_run(cq: EpollCq) -> None:
    """A poll whose hook looks again (has_completions runs the hooks too): a push after the
    inner run ends is still inside the outer poll, which returns it."""
    depth: list[int] = []

    def hook() -> None:
        depth.append(1)
        if len(depth) == 1:
            cq.has_completions()
            cq.push(_wc(3))

    cq.add_progress(hook)
    cq.req_notify(ARM_SLEEPER)
    assert [wc.wr_id for wc in cq.poll(4)] == [3]
    assert not _rung(cq)


def test_another_threads_push_rings_while_one_thread_runs_the_hook(cq: EpollCq) -> None:
    inside, go_on = threading.Event(), threading.Event()
    held: list[bool] = []

    def hook() -> None:
        if threading.current_thread() is not threading.main_thread() and not held:
            held.append(True)
            inside.set()
            go_on.wait(10)

    cq.add_progress(hook)
    poller = threading.Thread(target=cq.poll, args=(4,))
    poller.start()
    try:
        assert inside.wait(10)
        cq.req_notify(ARM_SLEEPER)
        cq.push(_wc(4))  # (this thread runs no hook: it rings)
        assert _rung(cq)
    finally:
        go_on.set()
        poller.join(10)
    assert not poller.is_alive()
