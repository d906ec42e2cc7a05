"""The interop harness itself, without a guest: what a test sees when a guest's kernel died."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.interop.guest import PANIC_MARK, Guest, GuestPanicError, GuestTimeoutError
from tests.support import REPO_ROOT


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


RERUN_CASES = '''
import pytest
from pathlib import Path
from tests.interop.guest import GuestPanicError

pytestmark = pytest.mark.interop
RUNS = Path(__file__).with_name("runs")


def _count(name: str) -> int:
    RUNS.mkdir(exist_ok=True)
    (RUNS / name).open("a").write("x")
    return len((RUNS / name).read_text())


def test_panics_once():
    if _count("once") == 1:
        try:
            raise GuestPanicError("guest g2 panicked during: a command")
        except GuestPanicError as exc:  # (as the suite's helpers wrap it)
            raise AssertionError(f"{exc} -- the server's output") from exc


def test_panics_every_time():
    _count("every")
    raise GuestPanicError("guest g1 panicked during: a command")


def test_fails_otherwise():
    _count("otherwise")
    assert 1 == 2
'''


def test_a_guest_test_runs_once_more_only_when_a_guests_kernel_panicked(tmp_path: Path) -> None:
    """The interop suite's rerun: a test failed by a guest's panic (raised, or the cause
    of the failure raised) runs a second time; a second panic fails it; a failure of any
    other kind fails at once."""
    (tmp_path / "conftest.py").write_text(
        "from tests.interop.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_cases.py").write_text(RERUN_CASES)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    interop: a guest's test\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          str(tmp_path)], check=False, cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    summary = (out.stdout.strip().splitlines() or [""])[-1]
    assert "2 failed, 1 passed, 2 rerun" in summary, out.stdout + out.stderr
    runs = {p.name: len(p.read_text()) for p in (tmp_path / "runs").iterdir()}
    assert runs == {"once": 2, "every": 2, "otherwise": 1}, runs
