"""``SMCSocket`` as a drop-in for ``socket.socket`` beyond send/recv: a socket collected
unclosed, ``sendmsg``/``recvmsg``/``recvmsg_into``, ``sendfile`` and ``SO_LINGER``.

Where a test takes ``decline``, it runs once over SMC-R and once fallen back to
TCP (the server declines), asserting the same behaviour: in TCP mode every call
is the real ``socket.socket``'s, so the TCP run checks the expectation itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import hashlib
import io
import os
import selectors
import socket
import struct
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import smcr
from tests.socket import smc_peer
from tests.socket.conftest import Peer, rnics

PeerFactory = Callable[..., Peer]
SHM = rnics(kinds=("shm",))
MODES = pytest.mark.parametrize("decline", [False, True], ids=["smcr", "tcp"])


def connect(port: int) -> smcr.SMCSocket:
    return smcr.create_connection((smc_peer.host(), port), timeout=20)


def expect_mode(s: smcr.SMCSocket, p: Peer, decline: bool) -> None:
    mode = "TCP" if decline else "SMCR"
    assert s.smc_info().mode == mode
    assert p.recv() == mode


def wait_readable(s: smcr.SMCSocket, n: int) -> None:
    """Until ``n`` bytes can be read (peeked: nothing is taken)."""
    deadline = time.monotonic() + 10
    while len(s.recv(n, socket.MSG_PEEK)) < n:
        assert time.monotonic() < deadline, "the echo did not come back"
        time.sleep(0.005)


@contextlib.contextmanager
def resource_warnings(port: int, expect: int = 1) -> Iterator[list[str]]:
    """Collect the ResourceWarnings given in the block and by the collector after it about
    sockets with TCP port ``port``, local or peer (not those other tests left behind).

    The block ends once ``expect`` of them came (bounded): a collection the runtime's
    threads started may have found the garbage first, and then ``gc.collect()`` here
    returns at once while that thread's finalizer warns a moment later -- after the
    block, unrecorded, if the block did not wait for it."""
    warned: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield warned
        deadline = time.monotonic() + 10
        while True:
            gc.collect()
            mine = [str(w.message) for w in list(caught)
                    if issubclass(w.category, ResourceWarning) and f", {port})" in str(w.message)]
            if len(mine) >= expect or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    warned += mine


# ---------------------------------------------------------------- collected unclosed


@rnics(roce_slow=True)
def test_collected_unclosed_socket_drains_closes_in_order_and_is_released(
        peer: PeerFactory) -> None:  # fmt: skip
    """Dropped (in a reference cycle, so only the collector finds it) right after a bulk
    sendall: a ResourceWarning; the send buffer still goes out, then the closing CDC (the
    peer gets every byte, then EOF); once the peer closes, the runtime lets the connection
    and its buffers go."""
    p = peer(smc_peer.count_server)
    port = p.recv()
    s = connect(port)
    assert p.recv() == "SMCR"
    stack, hc = s._stack, s._hc
    assert stack is not None and hc is not None
    with stack.lock:
        buffers_out = stack.pool.out
    msg = os.urandom(3 << 20)  # more than the peer's RMB and our send buffer together
    s.sendall(msg)
    cycle: list[object] = [s]
    cycle.append(cycle)
    # known by its local port: the runtime may have sent everything and the peer closed
    # before the warning's repr asks for the peer address (no raddr then, as a TCP one's)
    local_port = s.getsockname()[1]
    with resource_warnings(local_port) as warned:
        del s, cycle
    assert len(warned) == 1 and warned[0].startswith("unclosed <smcr.socket.SMCSocket fd=")
    assert warned[0].endswith("mode=SMCR>")
    assert p.recv() == ("eof", len(msg), hashlib.sha256(msg).hexdigest())
    assert smc_peer.wait_released(stack, hc.conn_id)
    assert hc.released
    deadline = time.monotonic() + 10  # the buffers follow once the peer answered DELETE RKEY
    while True:
        with stack.lock:
            if stack.pool.out == buffers_out - 1:
                break
        assert time.monotonic() < deadline, "the connection's buffers did not come back"
        time.sleep(0.01)


@SHM
def test_collected_in_a_thread_that_holds_the_runtime_lock(peer: PeerFactory) -> None:
    """The collector may run anywhere, even in code that holds the runtime's (not
    reentrant) lock: the finalizer neither takes it nor waits; the close follows once the
    lock is free."""
    p = peer(smc_peer.count_server)
    port = p.recv()
    s = connect(port)
    assert p.recv() == "SMCR"
    stack = s._stack
    assert stack is not None
    s.sendall(b"abc")
    box = [s]
    del s

    def drop() -> None:
        with stack.lock:
            box.clear()  # the last reference: the finalizer runs here
            gc.collect()

    with resource_warnings(port) as warned:
        t = threading.Thread(target=drop, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), "the finalizer blocked on the runtime's lock"
    assert len(warned) == 1
    assert p.recv() == ("eof", 3, hashlib.sha256(b"abc").hexdigest())


@rnics(roce_slow=True)
def test_collected_accepted_socket_gives_the_client_eof(peer: PeerFactory) -> None:
    """The server drops its accepted socket unclosed after a send: the client reads every
    byte, then EOF; the server's runtime lets the connection go once the client closed."""
    size = 100_000
    p = peer(smc_peer.drop_server, size)
    s = connect(p.recv())
    assert p.recv() == "SMCR"
    warned = p.recv()
    assert [m for c, m in warned if "SMCSocket" in m and c == "ResourceWarning"]
    assert sum(m.startswith("unclosed <smcr.socket.SMCSocket") and m.endswith("mode=SMCR>")
               for _, m in warned) == 1
    got = bytearray()
    while data := s.recv(65536):
        got += data
    assert got == smc_peer.pattern(size)
    s.close()
    p.ctl.send("closed")
    assert p.recv() is True


@SHM
def test_collected_listening_and_fallen_back_sockets_behave_like_socket_socket(
        peer: PeerFactory) -> None:  # fmt: skip
    """Both are real socket.socket objects, whose own finalizer closes and warns: the port of
    a dropped listener refuses connections, the peer of a dropped TCP-mode socket reads EOF."""
    srv = smcr.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    with resource_warnings(port) as warned:
        del srv
    assert len(warned) == 1 and warned[0].endswith("mode=LISTEN>")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)

    p = peer(smc_peer.count_server, True)
    port = p.recv()
    s = connect(port)
    expect_mode(s, p, True)
    s.sendall(b"abc")
    with resource_warnings(port) as warned:
        del s
    assert len(warned) == 1 and warned[0].endswith("mode=TCP>")
    assert p.recv() == ("eof", 3, hashlib.sha256(b"abc").hexdigest())


@SHM
def test_closed_socket_is_not_finalized_again(peer: PeerFactory) -> None:
    """close() retires the finalizer: no warning, no second close when collected."""
    p = peer(smc_peer.count_server)
    port = p.recv()
    s = connect(port)
    assert p.recv() == "SMCR"
    finalizer = s._finalizer
    assert finalizer is not None and finalizer.peek() is not None  # armed
    s.close()
    assert finalizer.peek() is None  # retired
    with resource_warnings(port, expect=0) as warned:
        del s
    assert warned == []
    assert p.recv()[0] == "eof"


# ---------------------------------------------------------------- sendmsg, recvmsg


@SHM
@MODES
def test_sendmsg_recvmsg_recvmsg_into(peer: PeerFactory, decline: bool) -> None:
    p = peer(smc_peer.echo_server, decline)
    s = connect(p.recv())
    assert p.recv()[0] == ("TCP" if decline else "SMCR")
    assert s.sendmsg([b"ab", memoryview(b"cd"), bytearray(b"ef")]) == 6
    assert s.recvmsg(6, 0, socket.MSG_WAITALL) == (b"abcdef", [], 0, None)
    # peek, then read: same bytes, same shape
    assert s.sendmsg([b"xyz"], [], 0) == 3
    wait_readable(s, 3)
    assert s.recvmsg(3, 0, socket.MSG_PEEK) == (b"xyz", [], 0, None)
    assert s.recvmsg(100) == (b"xyz", [], 0, None)
    # nothing there: MSG_DONTWAIT raises, as recv does (socket.socket with a timeout polls
    # first, ignoring the flag: blocking it does not)
    s.settimeout(None)
    with pytest.raises(BlockingIOError):
        s.recvmsg(10, 0, socket.MSG_DONTWAIT)
    with pytest.raises(BlockingIOError):
        s.recvmsg_into([bytearray(4)], 0, socket.MSG_DONTWAIT)
    s.settimeout(20)
    # scatter: what is there fills the buffers in order
    s.sendall(b"hello")
    wait_readable(s, 5)
    b1, b2 = bytearray(2), bytearray(10)
    assert s.recvmsg_into([b1, b2]) == (5, [], 0, None)
    assert bytes(b1) == b"he" and bytes(b2[:3]) == b"llo"
    s.sendall(b"0123456789ab")
    wait_readable(s, 12)
    b1, b2 = bytearray(4), bytearray(20)
    assert s.recvmsg_into([b1, memoryview(b2)[:3]], 0, socket.MSG_PEEK) == (7, [], 0, None)
    assert bytes(b1) == b"0123" and bytes(b2[:3]) == b"456"
    b1, b2 = bytearray(4), bytearray(8)
    assert s.recvmsg_into([b1, b2], 0, socket.MSG_WAITALL) == (12, [], 0, None)
    assert b1 + b2 == b"0123456789ab"
    # a large gather, blocking: every byte, in order, while the echo is read meanwhile
    parts = [os.urandom(700_000), os.urandom(5), os.urandom(900_000)]
    got = bytearray()

    def reader() -> None:
        while len(got) < sum(map(len, parts)):
            got.extend(s.recv(1 << 16))

    t = threading.Thread(target=reader)
    t.start()
    assert s.sendmsg(parts) == sum(map(len, parts))
    t.join(30)
    assert not t.is_alive() and got == b"".join(parts)
    # control messages: one TCP cannot take is EINVAL either way; over SMC-R every one is
    with pytest.raises(OSError) as exc:
        s.sendmsg([b"zz"], [(socket.SOL_SOCKET, 9999, b"xxxx")])
    assert exc.value.errno == errno.EINVAL
    if not decline:
        with pytest.raises(OSError) as exc:
            s.sendmsg([b"zz"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", 0))])
        assert exc.value.errno == errno.EINVAL
    with pytest.raises(ValueError):
        s.recvmsg(-1)
    with pytest.raises(ValueError):
        s.recvmsg_into([bytearray(1)], -1)
    s.close()
    with pytest.raises(OSError) as exc:
        s.sendmsg([b"late"])
    assert exc.value.errno == errno.EBADF


@SHM
def test_recvmsg_eof_and_nonblocking_partial_sendmsg(peer: PeerFactory) -> None:
    """A peer that does not read: a non-blocking sendmsg returns what fit, then raises;
    after the peer's close recvmsg gives (b"", [], 0, None)."""
    p = peer(smc_peer.drain_server)
    s = connect(p.recv())
    assert p.recv() == "SMCR"
    s.setblocking(False)
    chunk = os.urandom(1 << 20)
    # (our send buffer and the peer's RMBE but the byte held back: Connection.peer_hold)
    window = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) + s.smc_info().peer_rmb_size - 1
    sent = 0
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_WRITE)
    h = hashlib.sha256()
    while sent < window:
        try:
            n = s.sendmsg([chunk, chunk, chunk])
        except BlockingIOError:
            assert sel.select(5.0), f"not writable after {sent} of {window} bytes"
            continue
        assert 0 < n <= 3 * len(chunk)
        h.update((chunk * 3)[:n])
        sent += n
    with pytest.raises(BlockingIOError):
        s.sendmsg([b"z"])
    sel.close()
    s.setblocking(True)
    p.ctl.send("go")
    s.shutdown(socket.SHUT_WR)
    assert p.recv() == (sent, h.hexdigest())
    assert s.recvmsg(10) == (b"", [], 0, None)
    s.close()


# ---------------------------------------------------------------- sendfile


@SHM
@MODES
def test_sendfile(peer: PeerFactory, decline: bool, tmp_path: Path) -> None:
    """Bytes sent, file position left behind them, from ``offset`` (even 0 with the position
    elsewhere), to EOF without ``count``, non-seekable and in-memory files, and the stdlib's
    errors -- the same over SMC-R as socket.sendfile's over TCP."""
    data = os.urandom(2_500_000)
    path = tmp_path / "payload"
    path.write_bytes(data)
    p = peer(smc_peer.count_server, decline)
    s = connect(p.recv())
    expect_mode(s, p, decline)
    expected = bytearray()
    with path.open("rb") as f:
        assert s.sendfile(f, 1000, 2_000_000) == 2_000_000
        assert f.tell() == 2_001_000
        expected += data[1000:2_001_000]
        f.seek(5)
        assert s.sendfile(f, 0, 100) == 100
        assert f.tell() == 100
        expected += data[:100]
        assert s.sendfile(f, 2_400_000) == 100_000
        assert f.tell() == len(data)
        expected += data[2_400_000:]
        assert s.sendfile(f, len(data)) == 0
        with pytest.raises(ValueError):
            s.sendfile(f, 0, 0)
        with pytest.raises(TypeError):
            s.sendfile(f, 0, 1.5)  # type: ignore[arg-type]
        s.setblocking(False)
        with pytest.raises(ValueError):
            s.sendfile(f)
        s.setblocking(True)
    with path.open("r", encoding="latin-1") as text, pytest.raises(ValueError):
        s.sendfile(text)
    assert s.sendfile(io.BytesIO(b"in memory"), 3) == 6
    expected += b"memory"
    # the stdlib's os.sendfile path by name, as code calls it (CPython's own tests):
    # a regular file goes, what os.sendfile refuses is refused for the caller's fallback
    with path.open("rb") as f:
        assert s._sendfile_use_sendfile(f, 7, 1234) == 1234
        assert f.tell() == 1241
    expected += data[7:1241]
    with pytest.raises(socket._GiveupOnSendfile):  # type: ignore[attr-defined]
        s._sendfile_use_sendfile(io.BytesIO(b"in memory"))
    if not decline:  # socket.sendfile sends nothing from a pipe (its st_size is 0)
        r, w = os.pipe()
        os.write(w, b"piped")
        os.close(w)
        with os.fdopen(r, "rb", buffering=0) as pipe:
            assert s.sendfile(pipe) == 5
        expected += b"piped"
    s.shutdown(socket.SHUT_WR)
    assert p.recv() == ("eof", len(expected), hashlib.sha256(expected).hexdigest())
    s.close()


# ---------------------------------------------------------------- SO_LINGER


@rnics(roce_slow=True)
@MODES
@pytest.mark.parametrize("how", ["close", "drop"])
def test_so_linger_zero_resets_the_peer(peer: PeerFactory, decline: bool, how: str) -> None:
    """SO_LINGER (1, 0), then close() or a drop: the peer's read ends in ECONNRESET (a TCP
    reset; over SMC-R an abort CDC) and over SMC-R the connection goes once the peer's
    close answers the abort (as Linux keeps it: the peer may still write into its RMB)."""
    p = peer(smc_peer.count_server, decline)
    port = p.recv()
    s = connect(port)
    expect_mode(s, p, decline)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert struct.unpack("ii", s.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)) == (1, 0)
    s.sendall(b"x" * 100_000)
    stack, hc = s._stack, s._hc
    if how == "close":
        s.close()
    else:
        with resource_warnings(port) as warned:
            del s
        assert len(warned) == 1
    end, n, _ = p.recv()
    assert end == "ECONNRESET" and n <= 100_000
    if hc is not None:
        assert stack is not None and smc_peer.wait_released(stack, hc.conn_id)


@SHM
def test_so_linger_time_bounds_the_wait_for_the_send_buffer(
        peer: PeerFactory, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """SO_LINGER (1, 1) against a peer that reads nothing: close() returns after the linger
    time, not close_wait_tx (here made 60 s); the rest of the send buffer goes in the
    background, as TCP's kernel sends on after such a close, so the peer, reading later,
    gets every byte, then EOF (it got a prefix and EOF, the rest dropped unsaid)."""
    p = peer(smc_peer.count_server, False, True)
    s = connect(p.recv())
    assert p.recv() == "SMCR"
    stack = s._stack
    assert stack is not None
    monkeypatch.setattr(stack, "config", dataclasses.replace(stack.config, close_wait_tx=60.0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 1))
    s.setblocking(False)
    sent = bytearray()
    chunk = os.urandom(1 << 16)
    # (our send buffer and the peer's RMBE but the byte held back: Connection.peer_hold)
    window = s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) + s.smc_info().peer_rmb_size - 1
    while len(sent) < window:
        try:
            sent += chunk[: s.send(chunk)]
        except BlockingIOError:
            time.sleep(0.001)
    t = threading.Thread(target=s.close)
    t.start()
    t.join(20)
    assert not t.is_alive(), "close() waited past the linger time"
    p.ctl.send("go")
    end, n, digest = p.recv()
    assert end == "eof" and n == len(sent)
    assert digest == hashlib.sha256(sent).hexdigest()
