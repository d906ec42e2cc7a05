"""The TCP sockets a runtime watches for the peer's end of an SMC-R connection (RoCE): one
epoll set, so that a poller's sleep costs the same with a thousand connections as with one."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator

import pytest

from smcr.stack.clcwatch import ClcWatch
from smcr.stack.hostconn import HostConn


@pytest.fixture
def watch() -> Iterator[ClcWatch]:
    clc = ClcWatch(watch_tcp=True)
    yield clc
    clc.close()


def _connections(n: int) -> tuple[list[HostConn], list[socket.socket]]:
    """``n`` TCP connections over loopback: our ends as HostConns, and the peers' ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    ours, peers = [], []
    for i in range(n):
        sock = socket.create_connection(listener.getsockname())
        peers.append(listener.accept()[0])
        ours.append(HostConn(i, sock, threading.Condition()))
    listener.close()
    return ours, peers


def test_a_peer_ending_shows_once_and_only_for_its_connection(watch: ClcWatch) -> None:
    ours, peers = _connections(200)
    try:
        for hc in ours:
            watch.watch_end(hc)
        assert watch.ended() == []  # nobody spoke
        peers[17].close()
        peers[150].shutdown(socket.SHUT_WR)
        assert sorted(hc.conn_id for hc in watch.ended()) == [17, 150]
        assert watch.ended() == []  # taken off the watch until watched again
        watch.watch_end(ours[17])  # (a spurious wake-up is watched again)
        assert [hc.conn_id for hc in watch.ended()] == [17]
        watch.unwatch_tcp(ours[3])  # before its close: never reported
        peers[3].close()
        assert watch.ended() == []
        assert len(watch.tcp) == 197
    finally:
        for s in (*(hc.tcp for hc in ours), *peers):
            s.close()


def test_a_sleeping_poller_wakes_on_the_one_descriptor(watch: ClcWatch) -> None:
    """What a poller sleeps on is one descriptor for all of them: it becomes readable when
    any connection's peer ends."""
    ours, peers = _connections(50)
    try:
        for hc in ours:
            watch.watch_end(hc)
        poller = select.poll()
        poller.register(watch.tcp_ep.fileno(), select.POLLIN)
        assert poller.poll(0) == []
        threading.Timer(0.05, peers[42].close).start()
        assert poller.poll(5000) != []
        assert [hc.conn_id for hc in watch.ended()] == [42]
    finally:
        for s in (*(hc.tcp for hc in ours), *peers):
            s.close()
