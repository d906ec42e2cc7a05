"""The interop harness itself, without a guest: what a test sees when a guest's kernel died."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.interop.guest import PANIC_MARK, Guest, GuestPanicError, GuestTimeoutError


def _guest_dirs(base: Path) -> Guest:
    guest = Guest(base, index=2)
    (guest.share / "cmd").mkdir(parents=True)
    (guest.share / "out").mkdir(parents=True)
    guest.console.parent.mkdir(parents=True)
    guest.console.write_text("[    1.0] booted\n")
    return guest


def test_a_command_of_a_guest_whose_kernel_panics_fails_at_once_saying_so(tmp_path: Path) -> None:
    """The console says the kernel panicked while a command waits (no agent answers it):
    the wait ends within a few seconds, not at its timeout, with the console's lines."""
    guest = _guest_dirs(tmp_path)
    assert not guest.panicked()

    def panic() -> None:
        time.sleep(0.5)
        with guest.console.open("a") as console:
            console.write("[   90.1] BUG: unable to handle page fault\n"
                          "[   90.2] RIP: rxe_skb_tx_dtor\n"
                          f"[   90.3] {PANIC_MARK}: Fatal exception in interrupt\n")  # fmt: skip

    t0 = time.monotonic()
    threading.Thread(target=panic).start()
    with pytest.raises(GuestPanicError, match="g2 panicked during: sleep 100") as err:
        guest.run("sleep 100", timeout=60)
    assert time.monotonic() - t0 < 5
    assert "rxe_skb_tx_dtor" in str(err.value)
    assert isinstance(err.value, GuestTimeoutError)  # (callers that restart a stuck guest)
    assert guest.panicked()


def test_a_command_of_a_live_guest_that_answers_nothing_times_out(tmp_path: Path) -> None:
    """No panic on the console: the wait lasts its timeout and says it timed out."""
    guest = _guest_dirs(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(GuestTimeoutError, match="timed out: true") as err:
        guest.run("true", timeout=1.5)
    assert not isinstance(err.value, GuestPanicError)
    assert time.monotonic() - t0 >= 1.5
