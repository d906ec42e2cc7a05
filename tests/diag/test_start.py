"""smcr.diag.start across fork: a forked child opens an endpoint of its own."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import smcr.diag as diag
from smcr.diag import client


def test_a_child_forked_while_the_endpoint_is_being_started_starts_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The fork comes while start() holds its lock (another thread opening the endpoint):
    the child's own start() must not wait for a thread it does not have."""
    monkeypatch.setenv("SMCR_DIAG_DIR", str(tmp_path / "diag"))
    monkeypatch.delenv("SMCR_DIAG", raising=False)
    with diag._lock:  # as if another thread were inside start() at the fork
        pid = os.fork()
        if pid == 0:
            code = 2
            try:
                diag.start()
                code = 0 if diag.endpoint() is not None else 1
            finally:
                os._exit(code)
    deadline = time.monotonic() + 20
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
        done, status = os.waitpid(pid, os.WNOHANG)
    if not done:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done, "the child's start() waited for the parent's lock"
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_forked_child_does_not_keep_the_parents_endpoint_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The parent dies without its atexit (here: its endpoint closed, the file left) while
    a forked child lives on: the file is stale to the tools (refused, then removed), not
    a socket that takes connections and never answers."""
    monkeypatch.setenv("SMCR_DIAG_DIR", str(tmp_path / "diag"))
    monkeypatch.delenv("SMCR_DIAG", raising=False)
    monkeypatch.setattr(diag, "_state", diag._State())
    diag.start()
    ep = diag.endpoint()
    assert ep is not None
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(w)
            os.write(ready_w, b"x")  # (its fork handlers have run)
            os.read(r, 1)  # until the parent is done
        finally:
            os._exit(0)
    os.close(r)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        os.close(ready_r)
        ep.close(unlink=False)  # as if killed: the socket file stays
        replies = client.gather("ping", timeout=2.0)
        assert [(r.endpoint.pid, r.error) for r in replies] == [
            (os.getpid(), "stale (process gone)")]
        assert not ep.path.exists()
    finally:
        os.close(w)
        os.waitpid(pid, 0)
