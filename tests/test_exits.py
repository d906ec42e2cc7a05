"""smcr.exits: hooks run at a normal exit and when a signal with its default action ends the
process, which still dies of the signal; a hook that cannot finish (the signal came while the
main thread held a lock it needs) delays the end by the bound only."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import sys, threading, time
from smcr import exits
exits.HOOKS_BOUND = 1.0
out, how = sys.argv[1], sys.argv[2]
held = threading.Lock()
def first():
    with open(out, "a") as f:
        f.write("first\\n")
def second():
    with held:  # (the main thread holds it in "stuck")
        with open(out, "a") as f:
            f.write("second\\n")
exits.on_exit(first)
exits.on_exit(second)
if how == "exit":
    sys.exit(0)
if how == "stuck":
    held.acquire()
print("ready", flush=True)
threading.Event().wait()
"""


def run(tmp_path: Path, how: str, sig: signal.Signals | None) -> tuple[int, list[str], float]:
    out = tmp_path / "hooks"
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(out), how], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        t0 = time.monotonic()
        if sig is not None:
            assert proc.stdout.readline() == "ready\n"
            t0 = time.monotonic()
            proc.send_signal(sig)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = out.read_text().split() if out.exists() else []
    return code, lines, time.monotonic() - t0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_runs_the_hooks_newest_first_and_still_kills(tmp_path: Path,
                                                              sig: signal.Signals) -> None:
    code, lines, _ = run(tmp_path, "wait", sig)
    assert code == -sig
    assert lines == ["second", "first"]


def test_a_normal_exit_runs_the_hooks_once(tmp_path: Path) -> None:
    code, lines, _ = run(tmp_path, "exit", None)
    assert code == 0
    assert lines == ["second", "first"]


def test_a_hook_that_cannot_finish_delays_the_end_by_the_bound_only(tmp_path: Path) -> None:
    """The main thread holds the lock the newest hook needs when SIGTERM comes: the handler
    gives up on the hooks after the bound (1 s here) and the process dies of the signal."""
    code, lines, took = run(tmp_path, "stuck", signal.SIGTERM)
    assert code == -signal.SIGTERM
    assert lines == []  # (the stuck hook holds up the older one, which runs after it)
    assert took < 10.0
