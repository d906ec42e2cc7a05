"""No news waits for a sleeper that nobody rings: when a thread blocked in ``recv`` on one
connection returns, the news of another connection that came right after it is taken at
once (the progress thread takes over), not when some poller's sleep runs out."""

from __future__ import annotations

import select
import threading
import time

import smcr
from tests.socket import smc_peer
from tests.socket.conftest import Peer

TRIALS = 10


def test_news_after_a_blocked_reader_returns_is_taken_at_once() -> None:
    """Two threads used to sleep on the CQ's doorbell (the blocked reader and the progress
    thread); the reader drained it, and the progress thread slept on, the CQ unarmed, so
    the second connection's byte waited up to a second (a third of the trials).  A
    generous bound: the figure is about 10 ms (the progress thread's look-in)."""
    peer = Peer(smc_peer.two_conn_server)
    try:
        port = peer.recv()
        first = smcr.create_connection(("127.0.0.1", port), timeout=20)
        second = smcr.create_connection(("127.0.0.1", port), timeout=20)
        assert first.smc_info().mode == second.smc_info().mode == "SMCR"
        first.settimeout(None)
        delays = []
        for _ in range(TRIALS):
            got = threading.Event()

            def read(done: threading.Event = got) -> None:
                first.recv(1)
                done.set()

            reader = threading.Thread(target=read)
            reader.start()
            time.sleep(0.2)  # (the reader polls; the progress thread stands by)
            peer.ctl.send("go")
            assert got.wait(10)
            began = time.monotonic()
            readable, _, _ = select.select([second.fileno()], [], [], 5)
            delays.append(time.monotonic() - began)
            assert readable and second.recv(1) == b"y"
            reader.join(10)
        assert max(delays) < 0.5, sorted(delays)
        peer.ctl.send("quit")
        first.close()
        second.close()
    finally:
        peer.stop()
