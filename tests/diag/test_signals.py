"""Counters of a process that a signal ends are kept (issue 28): SIGTERM, SIGHUP and SIGINT
with their default action, and a program that handles SIGTERM itself as uvicorn does
(graceful shutdown, then the handler it found restored and the signal raised again)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smcr.diag import paths, store

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import signal, sys, threading
uvicorn_like = sys.argv[1] == "uvicorn"
if sys.argv[1] == "SIGINT":
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # (Python's own handler: a normal exit)
import smcr
from smcr import diag
diag.start()  # (smcr run starts it with the interpreter, before the program's handlers)
srv = smcr.create_server(("127.0.0.1", 0))
port = srv.getsockname()[1]
def serve():
    conn, _ = srv.accept()
    conn.sendall(conn.recv(100))
threading.Thread(target=serve, daemon=True).start()
cli = smcr.create_connection(("127.0.0.1", port))
cli.sendall(b"x" * 100)
assert cli.recv(100)
if uvicorn_like:
    stop = threading.Event()
    def graceful(signum, frame):
        stop.set()
    found = signal.signal(signal.SIGTERM, graceful)
    print("ready", flush=True)
    stop.wait()
    cli.close()
    signal.signal(signal.SIGTERM, found)
    signal.raise_signal(signal.SIGTERM)
    sys.exit("the signal did not end the process")
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.mark.parametrize(("how", "sig"), [("SIGTERM", signal.SIGTERM),
                                          ("SIGHUP", signal.SIGHUP),
                                          ("SIGINT", signal.SIGINT),
                                          ("uvicorn", signal.SIGTERM)])  # fmt: skip
def test_a_process_ended_by_a_signal_leaves_its_counters(
    how: str, sig: signal.Signals, tmp_path: Path,
) -> None:
    directory = tmp_path / "diag"
    env = {**os.environ, "SMCR_DIAG_DIR": str(directory)}
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, how], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        _until_the_main_thread_sleeps(proc.pid)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == -sig  # it still dies of the signal
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = [p for p in (directory / paths.EXITED).glob("*.json")]
    assert len(left) == 1, left
    counters = store.fold_exited(directory)
    handled = sum(counters.get(key, 0) for key in ("clnt_v1_succ_cnt", "clnt_v2_succ_cnt",
                                                    "srv_v1_succ_cnt", "srv_v2_succ_cnt"))
    fallbacks = sum(r["count"] for key in ("clnt_fback", "srv_fback")
                    for r in counters.get(key, []))  # fmt: skip
    assert handled + fallbacks == 2, counters  # both ends of the one connection


def _until_the_main_thread_sleeps(pid: int) -> None:
    """Wait until the program's main thread has slept for a while (in its final wait).
    CPython loses a signal that comes while the main thread hands the GIL to another
    thread just before it blocks on a lock: the C handler runs during the hand-off, and
    the lock's wait that follows is not interrupted (a race of any threaded program,
    which smcr's threads make likely right after the program's last smcr call)."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat")
    asleep, deadline = 0, time.monotonic() + 30
    while asleep < 5 and time.monotonic() < deadline:
        state = stat.read_text().rsplit(")", 1)[1].split()[0]
        asleep = asleep + 1 if state == "S" else 0
        time.sleep(0.02)
    assert asleep >= 5, "the program's main thread never went to sleep"
