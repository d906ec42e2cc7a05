"""The runtime's own listeners in a process out of descriptors: no spinning thread.

A listener whose ``accept`` fails (``EMFILE``) stays readable, and a level-triggered
watch on it would run its thread at a whole CPU for as long as the process stays at its
limit.  The shm RNIC's rendezvous listener and the diag endpoint leave theirs alone a
while instead (:data:`smcr.plainsock.ACCEPT_PAUSE`), and take the waiting connection once
descriptors are free again.  Each case in a fresh process (every thread of it is out of
descriptors meanwhile).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from smcr.diag import client, server
from smcr.rdma.shm.device import ShmDevice
from tests.support import out_of_descriptors, thread_cpu

WATCH = 0.5
"""Seconds the listener's thread is watched while a connection waits that it cannot take."""


def _watch(thread: Any, connect: Callable[[], None]) -> float:
    """CPU seconds ``thread`` uses over :data:`WATCH` while ``connect``'s connection waits
    at the limit."""
    with out_of_descriptors():
        connect()
        time.sleep(0.05)
        before = thread_cpu(thread)
        time.sleep(WATCH)
        return thread_cpu(thread) - before


def _diag_endpoint(out: Connection) -> None:
    ep = server.Endpoint(Path(tempfile.mkdtemp()) / f"{os.getpid()}.sock",
                         lambda request: {"hello": "there"})  # fmt: skip
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    used = _watch(ep._thread, lambda: probe.connect(str(ep.path)))
    probe.close()
    answer = client.query(ep.path, {"op": "ping"}, timeout=10.0)
    ep.close()
    out.send((used, answer))


def _shm_rendezvous(out: Connection) -> None:
    dev = ShmDevice("limit", directory=Path(tempfile.mkdtemp()))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    used = _watch(dev._server._worker, lambda: probe.connect(dev.path))
    deadline = time.monotonic() + 10.0
    while not dev._waiting and time.monotonic() < deadline:
        time.sleep(0.01)  # taken once descriptors are free, then waited on for its hello
    taken = len(dev._waiting)
    probe.close()
    dev.close()
    out.send((used, taken))


def _run(target: Callable[[Connection], None]) -> Any:
    ctx = mp.get_context("spawn")
    mine, theirs = ctx.Pipe()
    proc = ctx.Process(target=target, args=(theirs,), daemon=True)
    proc.start()
    try:
        assert mine.poll(60.0), "the process never answered"
        return mine.recv()
    finally:
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()


def test_the_diag_endpoint_pauses_accepting_out_of_descriptors() -> None:
    used, answer = _run(_diag_endpoint)
    assert used < WATCH / 5, f"the endpoint's thread used {used:.3f} s of {WATCH} s"
    assert answer["hello"] == "there"


def test_the_shm_rendezvous_pauses_accepting_out_of_descriptors() -> None:
    used, taken = _run(_shm_rendezvous)
    assert used < WATCH / 5, f"the rendezvous thread used {used:.3f} s of {WATCH} s"
    assert taken == 1
