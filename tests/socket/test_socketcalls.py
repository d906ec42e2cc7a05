"""The compiled data calls of an SMC-R socket (smcr.stack.conn.SocketCalls): which socket
objects use them, and that what they do is what the class's methods do."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import smcr
from smcr.stack.conn import METHODS, SocketCalls
from smcr.stack.counters import COUNTERS
from tests.socket.test_error_paths import pair, recv_exactly


def fast_methods(sock: socket.socket) -> list[str]:
    """The data calls that ``sock`` answers with its SocketCalls."""
    own = vars(sock)
    return [name for name in METHODS
            if isinstance(getattr(own.get(name), "__self__", None), SocketCalls)]  # fmt: skip


def test_an_smcr_socket_answers_its_data_calls_compiled_and_a_closed_one_does_not() -> None:
    with pair("smc") as (a, b):
        assert fast_methods(a) == fast_methods(b) == list(METHODS)
        a.close()
        assert fast_methods(a) == []  # nothing of the connection kept by the object
        with pytest.raises(OSError):
            a.sendall(b"x")


def test_every_data_call_moves_the_same_bytes_and_counts_the_same_as_the_class_methods() -> None:
    """Sizes round the RMBE (so the common case and the general path both run), through
    the socket's calls and through the class's own methods, both ways: the same bytes
    in order, and ``smcr stats`` counting each request once either way."""
    sizes = [1, 100, 1024, 4096, 65536, 300_000, 5 << 20]
    with pair("smc") as (a, b):
        for call in ("sendall", "send", "class"):
            for size in sizes:
                data = os.urandom(size)
                tx = sum(COUNTERS.tx_pd)
                got: list[bytes] = []
                def read(n: int = size, out: list[bytes] = got) -> None:
                    out.append(recv_exactly(b, n))

                reader = threading.Thread(target=read)
                reader.start()
                sent = 0
                if call == "sendall":
                    a.sendall(data)
                    calls = 1
                elif call == "send":
                    calls = 0
                    while sent < size:
                        sent += a.send(data[sent:])
                        calls += 1
                else:
                    assert isinstance(a, smcr.SMCSocket)
                    smcr.SMCSocket.sendall(a, data)
                    calls = 1
                reader.join(30)
                assert got == [data], (call, size)
                assert sum(COUNTERS.tx_pd) - tx >= calls  # (the general path counts each piece)
        for size in sizes[:5]:  # recv_into of what is there, then the rest
            data = os.urandom(size)
            b.sendall(data)
            buf = bytearray(size)
            rx = sum(COUNTERS.rx_pd)
            n = a.recv_into(buf)
            assert n > 0 and sum(COUNTERS.rx_pd) - rx == 1
            assert bytes(buf[:n]) + recv_exactly(a, size - n) == data


def test_recv_returns_what_is_there_up_to_bufsize() -> None:
    with pair("smc") as (a, b):
        b.sendall(b"abc")
        assert recv_exactly(a, 1) == b"a"
        assert a.recv(65536) == b"bc"  # a buffer the size of what is there
        b.sendall(b"defgh")
        assert recv_exactly(a, 5) == b"defgh"
        b.sendall(b"xyz")
        assert a.recv(2) == b"xy" and a.recv(2) == b"z"


@contextlib.contextmanager
def connected(cls: type[smcr.SMCSocket]) -> Iterator[tuple[smcr.SMCSocket, socket.socket]]:
    """A socket of ``cls`` connected over SMC-R to a server's, both closed afterwards."""
    srv = smcr.create_server(("127.0.0.1", 0))
    c = cls()
    c.settimeout(20)
    c.connect(srv.getsockname())
    s, _ = srv.accept()
    try:
        assert c.smc_info().mode == "SMCR"
        yield c, s
    finally:
        for x in (c, s, srv):
            x.close()


def test_a_subclass_that_overrides_a_data_call_keeps_its_own() -> None:
    """ssl's SSLSocket and a program's subclass of socket.socket (under ``smcr run``, of
    SMCSocket) override ``sendall`` and ``recv``: theirs are called, not the shortcut."""
    seen: list[str] = []

    class Counting(smcr.SMCSocket):
        def sendall(self, data: Any, flags: int = 0) -> None:
            seen.append("sendall")
            super().sendall(data, flags)

    with connected(Counting) as (c, s):
        assert fast_methods(c) == ["send", "recv", "recv_into"]
        c.sendall(b"hello")
        assert recv_exactly(s, 5) == b"hello" and seen == ["sendall"]


def test_a_subclass_that_overrides_recv_into_reads_through_it_with_recv() -> None:
    """``recv`` of a subclass that has its own ``recv_into`` goes through it (the stdlib's
    ``recv`` does not, but smcr's reads into a buffer: a subclass that counts or filters
    its reads sees every one)."""
    calls: list[int] = []

    class Counting(smcr.SMCSocket):
        def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
            calls.append(nbytes)
            return super().recv_into(buffer, nbytes, flags)

    with connected(Counting) as (c, s):
        assert "recv" not in fast_methods(c)
        s.sendall(b"hello")
        assert c.recv(10) == b"hello" and calls == [10]


def test_a_duplicate_serves_itself_after_the_original_closes() -> None:
    """``dup()`` and ``ssl``'s detach-and-rewrap make another socket object for the same
    connection: its calls are its own, not the (closed) original's."""
    with pair("smc") as (a, b):
        d = a.dup()
        try:
            a.close()
            assert fast_methods(d) == list(METHODS)
            d.sendall(b"after")
            assert recv_exactly(b, 5) == b"after"
            b.sendall(b"back")
            assert recv_exactly(d, 4) == b"back"
        finally:
            d.close()


def lone_pair() -> tuple[smcr.SMCSocket, socket.socket]:
    """A connected SMC-R pair whose client only the caller references (no fixture holds
    it), the server with a timeout."""
    srv = smcr.create_server(("127.0.0.1", 0))
    a = smcr.create_connection(srv.getsockname(), timeout=20)
    b, _ = srv.accept()
    srv.close()
    b.settimeout(20)
    assert a.smc_info().mode == "SMCR" and fast_methods(a) == list(METHODS)
    return a, b


def test_a_socket_nobody_references_is_collected_at_once() -> None:
    """The socket's calls do not hold the socket: no cycle keeps an unreferenced SMC-R
    socket (and its connection) alive until the cycle collector runs."""
    a, b = lone_pair()
    try:
        ref = weakref.ref(a)
        gc.disable()
        try:
            with pytest.warns(ResourceWarning):
                del a
            assert ref() is None
        finally:
            gc.enable()
        assert b.recv(1) == b""  # its finalizer closed the connection
    finally:
        b.close()


def test_a_data_call_kept_after_its_socket_was_collected_fails_as_on_a_closed_socket() -> None:
    """The socket's calls (bound methods of its SocketCalls) do not keep the socket alive
    (no cycle, see smcr.stack.conn): one kept alone fails with EBADF once the socket is
    collected and closed, not with an error of its own."""
    a, b = lone_pair()
    try:
        kept: list[Callable[[Any], object]] = [a.sendall, a.send, a.recv, a.recv_into]
        with pytest.warns(ResourceWarning):
            del a
        assert b.recv(1) == b""  # collected and closed
        for call, arg in zip(kept, (b"x", b"x", 1, bytearray(1)), strict=True):
            with pytest.raises(OSError) as err:
                call(arg)
            assert err.value.errno == errno.EBADF
    finally:
        b.close()


def test_a_blocking_read_waits_for_its_bytes_compiled_and_hands_the_rest_on() -> None:
    """A blocking ``recv_into`` that must wait (no flags: for any byte; MSG_WAITALL: for
    all it asked) waits and copies in the compiled code, the general path never called;
    pieces that come one by one make up one MSG_WAITALL read.  A socket with a timeout,
    and a MSG_WAITALL read that EOF cuts short, are the general path's."""
    with pair("smc") as (a, b):
        path = vars(a)["recv_into"].__self__.path
        general = path.general_reads
        a.settimeout(None)

        def later(*pieces: bytes, then: Callable[[], object] | None = None) -> threading.Thread:
            def run() -> None:
                for piece in pieces:
                    threading.Event().wait(0.05)
                    b.sendall(piece)
                if then is not None:
                    then()

            t = threading.Thread(target=run)
            t.start()
            return t

        buf = bytearray(6)
        t = later(b"abc")
        assert a.recv_into(buf) == 3 and buf[:3] == b"abc"
        t.join()
        t = later(b"ab", b"cd", b"ef")
        assert a.recv_into(buf, 6, socket.MSG_WAITALL) == 6 and buf == b"abcdef"
        t.join()
        assert path.general_reads == general
        a.settimeout(5)
        t = later(b"xyz")
        assert a.recv_into(buf) == 3 and buf[:3] == b"xyz"
        t.join()
        assert path.general_reads == general + 1
        a.settimeout(None)
        t = later(b"12", then=lambda: b.shutdown(socket.SHUT_WR))
        assert a.recv_into(buf, 6, socket.MSG_WAITALL) == 2 and buf[:2] == b"12"
        t.join()
        assert path.general_reads == general + 2
        assert a.recv_into(buf) == 0  # EOF
