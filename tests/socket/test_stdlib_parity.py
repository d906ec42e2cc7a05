"""What CPython's own socket tests check, held against plain TCP in the same test: the
answers an SMC-R socket gives where a program looks at the socket API's edges (a send
after the peer closed, bad sendmsg and shutdown arguments, the blocking flag of the
descriptor ``fileno()`` returns)."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import struct
import subprocess
import sys
from collections.abc import Callable

import pytest

import smcr
from tests.socket.test_error_paths import outcome, pair, recv_exactly, wait_until

Story = Callable[[socket.socket, socket.socket], list[object]]


def both(story: Story) -> tuple[list[object], list[object]]:
    with pair("tcp") as (a, b):
        tcp = story(a, b)
    with pair("smc") as (a, b):
        smc = story(a, b)
    return tcp, smc


def send_after_peer_close(a: socket.socket, b: socket.socket) -> list[object]:
    """The peer closes; we send until a send fails (TCP: the first is taken, the peer's
    reset makes a later one fail)."""
    b.close()
    assert a.recv(10) == b""  # its close has arrived
    seen: list[object] = [outcome(lambda: a.send(b"late"))]
    failed: list[object] = []

    def fails() -> bool:
        result = outcome(lambda: a.send(b"x"))
        if not isinstance(result, int):
            failed.append(result)
        return bool(failed)

    assert wait_until(fails)
    return seen + failed


def test_a_send_after_the_peer_closed_is_taken_once_as_on_tcp() -> None:
    tcp, smc = both(send_after_peer_close)
    assert tcp[0] == smc[0] == 4
    assert tcp[1] in (BrokenPipeError, ConnectionResetError) and smc[1] is BrokenPipeError


def send_after_peer_abort(a: socket.socket, b: socket.socket) -> list[object]:
    """The peer closes abortively (SO_LINGER 0: a TCP reset, over SMC-R the abort CDC); once
    it has arrived (we turn readable), we send twice."""
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    b.close()
    assert select.select([a], [], [], 10.0)[0], "the reset did not arrive"
    return [outcome(lambda: a.send(b"x")), outcome(lambda: a.send(b"x"))]


def test_a_send_after_the_peers_abort_says_reset_once_then_broken_pipe() -> None:
    """As TCP after a reset (and Linux SMC, whose sendmsg gives the pending ECONNRESET for
    its EPIPE): ECONNRESET once, then EPIPE.  smcr said EPIPE at once when the abort had
    come before the send (seen live against the kernel, tests/interop), so a program could
    not tell the peer's reset from its close."""
    tcp, smc = both(send_after_peer_abort)
    assert tcp == smc == [ConnectionResetError, BrokenPipeError], (tcp, smc)


def bad_sendmsg(a: socket.socket, b: socket.socket) -> list[object]:
    """What the C sendmsg rejects before sending anything (TypeError), then one that goes."""
    msg = b"m"
    seen: list[object] = []
    args: tuple[object, ...]
    for args in ((b"not in an iterable",), (object(),), ([object()],), ([msg, object()],),
                 ([msg], object()), ([msg], [], object()), ([msg], [], 0, object()),
                 ([msg], [object()]), ([msg], [(object(), 0, b"data")]),
                 ([msg], [(0, object(), b"data")]), ([msg], [(0, 0, object())]),
                 ([msg], [(0, 0)]), ([msg], [(0, 0, b"data", 42)]),
                 ([msg], [(0, 0, b""), object()])):  # fmt: skip
        try:
            a.sendmsg(*args)
            seen.append("sent")
        except TypeError:
            seen.append(TypeError)
    a.sendmsg([b"done"])
    seen.append(b.recv(100))
    return seen


def test_sendmsg_rejects_bad_arguments_as_tcp_does() -> None:
    tcp, smc = both(bad_sendmsg)
    assert tcp == smc and tcp[-1] == b"done" and set(tcp[:-1]) == {TypeError}


def bad_shutdown(a: socket.socket, b: socket.socket) -> list[object]:
    seen: list[object] = []
    for how in (2**31, -(2**31) - 1, 7):
        try:
            a.shutdown(how)
            seen.append("done")
        except (OverflowError, OSError) as exc:
            seen.append(type(exc))
    a.sendall(b"still open")
    seen.append(b.recv(100))
    return seen


def test_shutdown_refuses_bad_arguments_as_tcp_does() -> None:
    tcp, smc = both(bad_shutdown)
    assert tcp == smc == [OverflowError, OverflowError, OSError, b"still open"]


def blocking_flags(a: socket.socket, b: socket.socket) -> list[object]:
    """``O_NONBLOCK`` of what ``fileno()`` returns, as the timeout changes (Python sockets
    with a timeout are non-blocking underneath; blocking ones are not)."""
    seen: list[object] = []
    for timeout in (None, 0.0, 5.0, None):
        a.settimeout(timeout)
        seen.append(bool(fcntl.fcntl(a.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK))
    return seen


@pytest.mark.parametrize("side", ["client", "listener"])
def test_the_descriptor_of_fileno_is_blocking_as_the_socket_is(side: str) -> None:
    if side == "client":
        tcp, smc = both(blocking_flags)
    else:
        srv = smcr.create_server(("127.0.0.1", 0))
        plain = socket.create_server(("127.0.0.1", 0))
        try:
            smc, tcp = blocking_flags(srv, srv), blocking_flags(plain, plain)
        finally:
            srv.close()
            plain.close()
    assert tcp == smc == [False, True, True, False]


def shared_descriptors(a: socket.socket, b: socket.socket) -> list[object]:
    """dup, a socket made from (a dup of) fileno(), detach and a socket made from what it
    returned: all on the one connection, which ends when the last of them closes."""
    seen: list[object] = []
    kind = type(a)
    d = a.dup()
    a.sendall(b"a")
    d.sendall(b"d")
    seen.append(recv_exactly(b, 2))
    a.close()
    d.sendall(b"still")
    seen.append(recv_exactly(b, 5))
    f = kind(d.family, d.type, d.proto, os.dup(d.fileno()))  # what socket.fromfd does
    b.sendall(b"to fromfd")
    seen.append(recv_exactly(f, 9))
    f.close()
    fd = d.fileno()
    detached = d.detach()
    seen += [detached == fd, d._closed, outcome(lambda: d.recv(1))]  # type: ignore[attr-defined]
    n = kind(socket.AF_INET, socket.SOCK_STREAM, fileno=detached)
    b.sendall(b"to the new one")
    seen.append(recv_exactly(n, 14))
    borrowed = kind(fileno=n.fileno())  # http.client's response.fileno() users do this
    borrowed.sendall(b"via ")
    seen.append(borrowed.detach() == n.fileno())
    n.sendall(b"from it")
    seen.append(recv_exactly(b, 11))
    n.close()
    seen.append(b.recv(10))  # the last holder closed: EOF
    return seen


def test_dup_fromfd_and_detach_share_the_connection_as_on_tcp() -> None:
    tcp, smc = both(shared_descriptors)
    assert tcp == smc == [b"ad", b"still", b"to fromfd", True, True, OSError,
                          b"to the new one", True, b"via from it", b""]  # fmt: skip


def share_after_close(a: socket.socket, b: socket.socket) -> list[object]:
    """Both ends closed their sides, the connection is over (getpeername: ENOTCONN);
    dup and detach still work, as a descriptor is dup'ed whatever its connection's
    state, and what they give reads what was left."""
    kind = type(a)
    b.sendall(b"last")
    b.close()
    seen: list[object] = [recv_exactly(a, 2)]
    a.shutdown(socket.SHUT_WR)
    assert wait_until(lambda: outcome(a.getpeername) is OSError)
    d = outcome(a.dup)
    seen.append(isinstance(d, socket.socket))
    if isinstance(d, socket.socket):
        seen.append(recv_exactly(d, 2))
        d.close()
    n = outcome(lambda: kind(socket.AF_INET, socket.SOCK_STREAM, fileno=a.detach()))
    seen.append(n.recv(10) if isinstance(n, socket.socket) else n)  # EOF
    if isinstance(n, socket.socket):
        n.close()
    return seen


def test_dup_and_detach_after_the_connection_ended_as_on_tcp() -> None:
    tcp, smc = both(share_after_close)
    assert tcp == smc == [b"la", True, b"st", b""]


def connect_after_refusal(kind: type[socket.socket]) -> list[object]:
    """A non-blocking connect to a port nobody listens on yet, then connect again: the
    kernel reports the refusal once, and the next connect starts anew (asyncio's
    sock_connect retries so)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    addr = listener.getsockname()
    s = kind(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    seen: list[object] = [s.connect_ex(addr)]
    select.select([], [s], [], 10)
    seen.append(s.connect_ex(addr))  # the refusal, reported by this call
    listener.listen(1)
    seen.append(s.connect_ex(addr))
    seen.append(bool(select.select([], [s], [], 10)[1]))
    seen.append(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
    s.close()
    listener.close()
    return seen


def test_a_socket_connects_again_after_a_refused_connect_as_on_tcp() -> None:
    tcp, smc = connect_after_refusal(socket.socket), connect_after_refusal(smcr.SMCSocket)
    assert tcp == smc
    assert tcp[:2] == [errno.EINPROGRESS, errno.ECONNREFUSED] and tcp[3:] == [True, 0]


def descriptor_after_close(a: socket.socket, b: socket.socket) -> list[object]:
    """The descriptor ``fileno()`` gave is gone once ``close()`` returns (CPython's
    test_epoll: unregistering it then fails with EBADF), whoever closed first."""
    seen: list[object] = []
    for sock in (a, b):
        fd = sock.fileno()
        ep = select.epoll()
        try:
            ep.register(fd, select.EPOLLIN)
            sock.close()
            try:
                ep.unregister(fd)
                seen.append("still registered")
            except OSError as exc:
                seen.append(errno.errorcode.get(exc.errno or 0, str(exc)))
        finally:
            ep.close()
    return seen


def test_the_descriptor_is_gone_when_close_returns_as_on_tcp() -> None:
    tcp, smc = both(descriptor_after_close)
    assert tcp == smc == ["EBADF", "EBADF"]


EXIT_WITH_A_THREAD_IN_ACCEPT = """
import socket, sys, threading
import smcr
make = smcr.create_server if sys.argv[1] == "smc" else socket.create_server
srv = make(("127.0.0.1", 0))
served = threading.Event()
def serve():
    while True:
        conn, _ = srv.accept()
        conn.close()
        served.set()
threading.Thread(target=serve, daemon=True).start()
socket.create_connection(srv.getsockname()).close()
assert served.wait(20)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("kind", ["tcp", "smc"])
def test_exit_with_a_daemon_thread_in_accept_is_quiet_as_on_tcp(kind: str) -> None:
    """A program whose daemon thread accepts forever just ends: the interpreter's exit does
    not close the listener under that thread (as for ``socket.socket``); no traceback of
    an ``accept`` woken by EBADF at exit."""
    done = subprocess.run([sys.executable, "-c", EXIT_WITH_A_THREAD_IN_ACCEPT, kind],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "exiting\n", "")


EXIT_WITH_THREADS_IN_RECV_AND_SEND = """
import socket, sys, threading, time
import smcr
make, connect = ((smcr.create_server, smcr.create_connection) if sys.argv[1] == "smc"
                 else (socket.create_server, socket.create_connection))
srv = make(("127.0.0.1", 0))
pairs = []
for _ in range(2):
    c = connect(srv.getsockname())
    s, _ = srv.accept()
    c.sendall(b"x")
    assert s.recv(1) == b"x"
    pairs.append((c, s))
if sys.argv[1] == "smc":
    assert all(x.smc_info().mode == "SMCR" for pair in pairs for x in pair)
started = threading.Barrier(4)
def reader(sock):
    started.wait()
    sock.recv(10)
    print("a read returned", flush=True)
def writer(sock):
    started.wait()
    sock.sendall(bytes(64 << 20))  # nobody reads: it blocks once the buffers are full
    print("a write returned", flush=True)
for sock in pairs[0]:
    threading.Thread(target=reader, args=(sock,), daemon=True).start()
threading.Thread(target=writer, args=(pairs[1][0],), daemon=True).start()
started.wait()
time.sleep(0.5)  # (the threads are blocked by then; the output is the same if not)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("kind", ["tcp", "smc"])
def test_exit_with_daemon_threads_in_recv_and_send_is_quiet_as_on_tcp(kind: str) -> None:
    """A program exits while its daemon threads wait in ``recv`` (both ends in the process)
    and in ``sendall`` to a peer that does not read: TCP leaves them blocked until the
    process is gone; the runtime's end of the links at exit must not wake them with
    ECONNRESET and a traceback each."""
    done = subprocess.run([sys.executable, "-c", EXIT_WITH_THREADS_IN_RECV_AND_SEND, kind],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (done.returncode, done.stdout, done.stderr) == (0, "exiting\n", "")


def closed_under_the_socket(a: socket.socket, b: socket.socket) -> list[object]:
    """A program closes what ``fileno()`` gave (``os.close``), then reads and writes a
    non-blocking socket with nothing to read and no room to write (TCP: calls on the
    closed descriptor fail with EBADF; tornado's test_inline_read_error does this)."""
    a.setblocking(False)
    fd = a.fileno()
    saved = os.dup(fd)  # (to put it back: the pair closes the socket afterwards)
    os.close(fd)
    try:
        seen = [errno_of(lambda: a.recv(1))]
    finally:
        os.dup2(saved, fd)
        os.close(saved)
    seen.append(errno_of(lambda: a.recv(1)))  # it is back: nothing to read
    return seen


def errno_of(call: Callable[[], object]) -> object:
    """A call's result, or the errno of its OSError."""
    try:
        return call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, exc.errno)


def test_reads_on_a_descriptor_closed_under_the_socket_fail_as_on_tcp() -> None:
    tcp, smc = both(closed_under_the_socket)
    assert tcp == smc == ["EBADF", "EAGAIN"]


def readable_when_send_returns(a: socket.socket, b: socket.socket) -> list[object]:
    """Both ends in this process: is the receiver's descriptor readable the moment the
    send returns (TCP over loopback: yes, delivery is part of the send; an event loop
    that runs both ends relies on it, as tornado's tests do)?"""
    b.setblocking(False)
    seen: list[object] = []
    for _ in range(20):
        a.send(b"x")
        seen.append(select.select([b], [], [], 0)[0] == [b])
        seen.append(b.recv(10))
    return seen


def test_the_peer_in_this_process_is_readable_when_send_returns_as_on_tcp() -> None:
    tcp, smc = both(readable_when_send_returns)
    assert tcp == smc == [True, b"x"] * 20


def unaccepted_when_the_listener_closes(kind: str) -> list[object]:
    """A client connects; the listener closes without accepting it: the client's
    connection is reset, and ``getsockopt(SO_ERROR)`` says so, once (tornado's
    test_stop_in_callback counts on such connects failing)."""
    make_server = smcr.create_server if kind == "smc" else socket.create_server
    connect = smcr.create_connection if kind == "smc" else socket.create_connection
    srv = make_server(("127.0.0.1", 0))
    with connect(srv.getsockname(), timeout=20) as c:
        srv.close()
        errors: list[int] = []

        def told() -> bool:
            errors.append(c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR))
            return bool(errors[-1])

        assert wait_until(told)
        return [errno.errorcode[errors[-1]], c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)]


def test_a_listener_that_closes_resets_the_connections_it_did_not_accept_as_on_tcp() -> None:
    tcp, smc = (unaccepted_when_the_listener_closes(kind) for kind in ("tcp", "smc"))
    assert tcp == smc == ["ECONNRESET", 0]


def close_with_bytes_unsent(kind: str) -> list[object]:
    """A sender fills what a peer that does not read yet can take, closes, and only then
    (the same thread: an event loop running both ends) the peer reads: TCP's ``close``
    returns at once and its kernel sends the rest; every byte arrives, then EOF."""
    make_server = smcr.create_server if kind == "smc" else socket.create_server
    make_client = smcr.create_connection if kind == "smc" else socket.create_connection
    srv = make_server(("127.0.0.1", 0))
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # (smcr: a 16 KiB RMB)
    client = make_client(srv.getsockname(), timeout=20)
    conn, _ = srv.accept()
    srv.close()
    client.setblocking(False)
    sent = 0
    chunk = b"y" * 65536
    try:
        while True:
            sent += client.send(chunk)
    except BlockingIOError:
        pass
    client.close()
    conn.settimeout(20)
    got = 0
    while data := conn.recv(1 << 20):
        got += len(data)
    conn.close()
    return [sent > 65536, got == sent]


def test_close_with_bytes_the_peer_has_not_read_yet_loses_none_as_on_tcp() -> None:
    assert close_with_bytes_unsent("tcp") == close_with_bytes_unsent("smc") == [True, True]


def taken_before_it_would_block(kind: str, sndbuf: int | None) -> int:
    """Bytes a non-blocking sender gets rid of while its peer reads nothing, with
    ``SO_SNDBUF`` lowered after ``connect`` (or left alone)."""
    make_server = smcr.create_server if kind == "smc" else socket.create_server
    make_client = smcr.create_connection if kind == "smc" else socket.create_connection
    with make_server(("127.0.0.1", 0)) as srv:
        client = make_client(srv.getsockname(), timeout=20)
        conn, _ = srv.accept()
    if sndbuf is not None:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    client.setblocking(False)
    taken = 0
    try:
        while True:
            taken += client.send(b"z" * 65536)
    except BlockingIOError:
        pass
    client.close()
    conn.close()
    return taken


def test_sndbuf_lowered_after_connect_takes_less_as_on_tcp() -> None:
    """TCP's send buffer shrinks when ``SO_SNDBUF`` is lowered on a connected socket; over
    SMC-R what a send may have in flight shrinks too (the allocated buffer stays):
    asyncio's sendfile tests lower it to see a transfer that cannot finish at once."""
    for kind in ("tcp", "smc"):
        small, default = (taken_before_it_would_block(kind, n) for n in (4096, None))
        assert small < default, (kind, small, default)


def peer_after_an_abortive_close(kind: str) -> list[object]:
    """A client sends, then closes with SO_LINGER 0: the server's connection is reset at
    once, as a TCP reset leaves it -- ``getpeername`` says ENOTCONN before the server
    has done anything (ssl's ``wrap_socket`` asks exactly that to tell "closed before
    the TLS handshake")."""
    make_server = smcr.create_server if kind == "smc" else socket.create_server
    connect = smcr.create_connection if kind == "smc" else socket.create_connection
    with make_server(("127.0.0.1", 0)) as srv:
        srv.settimeout(20)
        c = connect(srv.getsockname(), timeout=20)
        s, _ = srv.accept()
        with s:
            c.sendall(b"early")
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()

            def unconnected() -> bool:
                try:
                    s.getpeername()
                except OSError as exc:
                    return exc.errno == errno.ENOTCONN
                return False

            return [wait_until(unconnected)]


def test_an_abortive_close_resets_the_peers_connection_at_once_as_on_tcp() -> None:
    tcp, smc = (peer_after_an_abortive_close(kind) for kind in ("tcp", "smc"))
    assert tcp == smc == [True]
