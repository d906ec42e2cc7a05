"""The wait of a close for its send buffer (``stack/closing.py``): how long it goes on."""

from __future__ import annotations

from smcr.stack.closing import EXIT_KEEP, drain_deadline

WAIT = 2.0


def test_a_wait_ends_at_its_deadline_unless_the_link_delivered() -> None:
    began, deadline = 100.0, 102.0
    assert drain_deadline(101.0, deadline, began, 5, 9, WAIT) == deadline  # (not yet due)
    assert drain_deadline(102.5, deadline, began, 5, 5, WAIT) == deadline  # nothing moved
    assert drain_deadline(102.5, deadline, began, None, None, WAIT) == deadline  # shm: no mark
    assert drain_deadline(102.5, deadline, began, 5, 6, WAIT) == 102.5 + WAIT  # it delivers


def test_a_link_that_keeps_delivering_holds_a_close_for_exit_keep_at_most() -> None:
    """A peer that never reads, on a link that other connections keep busy: its mark moves
    at every look, and the wait still ends :data:`EXIT_KEEP` after it began."""
    began = now = 100.0
    deadline = began + WAIT
    mark = 0
    while now < began + 10 * EXIT_KEEP:
        now += 0.5
        extended = drain_deadline(now, deadline, began, mark, mark + 1, WAIT)
        mark += 1
        if now >= extended:
            break
        deadline = extended
    assert began + EXIT_KEEP <= now <= began + EXIT_KEEP + WAIT + 0.5
