"""Peer processes for the SMCSocket tests (spawned: a forked runtime is unsafe)."""

from __future__ import annotations

import contextlib
import errno
import gc
import hashlib
import ipaddress
import os
import selectors
import socket
import threading
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import Connection

import smcr
from smcr.stack.runtime import Stack, get_stack
from smcr.tools.netns import enter_netns
from tests.support import voluntary_switches

HOST_ENV = "SMCR_TEST_HOST"
HOST6_ENV = "SMCR_TEST_HOST6"


def host() -> str:
    """The server's address: 127.0.0.1, or the server namespace's veth address (RoCE)."""
    return os.environ.get(HOST_ENV, "127.0.0.1")


def host6() -> str:
    """The server's IPv6 address: ::1, or the server namespace's veth address (RoCE)."""
    return os.environ.get(HOST6_ENV, "::1")


def in_netns(ctl: Connection, name: str, target: Callable[..., None], *args: object) -> None:
    """Run a peer ``target`` inside network namespace ``name`` (the RoCE server host)."""
    enter_netns(name)
    target(ctl, *args)


def echo_server(ctl: Connection, decline: bool = False, conns: int = 1) -> None:
    """Accept ``conns`` clients one after another; echo until EOF; report each mode."""
    if decline:
        get_stack(ipaddress.ip_address(host())).pool.max_buffers = 0  # handshakes decline: MEM
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    for _ in range(conns):
        c, _ = srv.accept()
        info = c.smc_info()
        ctl.send((info.mode, info.local_code, info.peer_code))
        with c:
            while data := c.recv(65536):
                c.sendall(data)
    srv.close()


def threaded_echo_server(ctl: Connection, conns: int, size: int) -> None:
    """Accept ``conns`` clients, a thread each that echoes ``size``-byte messages until EOF
    (a threaded server: every connection's thread blocked in its own ``recv``)."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])

    def echo(c: smcr.SMCSocket) -> None:
        buf = bytearray(size)
        with c:
            while c.recv_into(buf, size, socket.MSG_WAITALL) == size:
                c.sendall(buf)

    threads = []
    for _ in range(conns):
        c, _ = srv.accept()
        threads.append(threading.Thread(target=echo, args=(c,)))
        threads[-1].start()
    for t in threads:
        t.join()
    srv.close()
    ctl.send("done")


def sink_server(ctl: Connection) -> None:
    """Accept one client, read to EOF, send back SHA-256 of what came and its own stream."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    total, seed = ctl.recv()
    h = hashlib.sha256()
    out = hashlib.sha256()
    block = hashlib.sha256(seed).digest() * 2048  # 64 KiB of pattern
    sent = 0
    c.setblocking(False)
    got_eof = False
    buf = bytearray(1 << 16)
    sel = selectors.DefaultSelector()
    sel.register(c, selectors.EVENT_READ | selectors.EVENT_WRITE)
    while not got_eof or sent < total:
        for _key, ev in sel.select(5.0):
            if ev & selectors.EVENT_READ and not got_eof:
                try:
                    n = c.recv_into(buf)
                except BlockingIOError:
                    n = -1
                if n == 0:
                    got_eof = True
                elif n > 0:
                    h.update(buf[:n])
            if ev & selectors.EVENT_WRITE and sent < total:
                chunk = block[: min(len(block), total - sent)]
                try:
                    n = c.send(chunk)
                except BlockingIOError:
                    n = 0
                out.update(chunk[:n])
                sent += n
        if sent >= total:
            sel.modify(c, selectors.EVENT_READ)
    c.setblocking(True)
    c.shutdown(socket.SHUT_WR)
    ctl.send((h.hexdigest(), out.hexdigest()))
    c.close()
    srv.close()


def hold_server(ctl: Connection) -> None:
    """Accept one client, send 5 bytes, then wait to be killed."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    c.sendall(b"hello")
    ctl.send(c.smc_info().mode)
    time.sleep(60)


def drain_server(ctl: Connection, rcvbuf: int = 0) -> None:
    """Accept one client and read nothing until told; then read to EOF, report count and
    SHA-256 of what came.  ``rcvbuf``: SO_RCVBUF (the RMB size) if set."""
    srv = smcr.create_server((host(), 0))
    if rcvbuf:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    ctl.send(c.smc_info().mode)
    ctl.recv()  # the client's send buffer and our RMB are full
    h = hashlib.sha256()
    n = 0
    while data := c.recv(65536):
        h.update(data)
        n += len(data)
    ctl.send((n, h.hexdigest()))
    c.close()
    srv.close()


def half_close_server(ctl: Connection) -> None:
    """Read to EOF, then, once told to go on (the test has looked at its end's state, which
    the close would change), answer with the byte count and close."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    n = 0
    while data := c.recv(4096):
        n += len(data)
    assert ctl.recv() == "go"
    c.sendall(str(n).encode())
    ctl.send(c.smc_info().state)
    c.close()


def plain_tcp_client(port: int, payload: bytes) -> bytes:
    """A plain socket.socket client (runs in the test process)."""
    with socket.create_connection((host(), port), timeout=10) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while data := s.recv(65536):
            out += data
        return out


def many_server(ctl: Connection, n: int) -> None:
    """Accept ``n`` clients, then echo on each in its own thread."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    threads = []
    modes = []

    def echo(c: smcr.SMCSocket) -> None:
        with c:
            while data := c.recv(65536):
                c.sendall(data)

    for _ in range(n):
        c, _ = srv.accept()
        modes.append(c.smc_info().mode)
        t = threading.Thread(target=echo, args=(c,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(60)
    ctl.send((modes, len(get_stack(ipaddress.ip_address(host())).engine.lgrs), os.getpid()))


def oob_server(ctl: Connection) -> None:
    """Read the normal bytes up to the mark, the urgent byte, then the rest; report them.

    The client sends 2 bytes, 1 urgent, 2 more.  No read may cross the mark, whatever
    has arrived, so the reads before it are collected until they hold 2 bytes (a read
    that crossed it would bring more); the urgent byte is read once it is there (EINVAL
    until then), within a deadline; the rest with MSG_WAITALL.
    """
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    ctl.recv()  # the client has sent everything
    before = b""
    while len(before) < 2 and (chunk := c.recv(100)):
        before += chunk
    deadline = time.monotonic() + 20.0
    while True:
        try:
            urgent = c.recv(1, socket.MSG_OOB)
            break
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EAGAIN) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    after = c.recv(2, socket.MSG_WAITALL)
    ctl.send((before, urgent, after))
    c.close()


def echo_server6(ctl: Connection) -> None:
    """One IPv6 client on :func:`host6`, echoed until EOF; reports the mode."""
    srv = smcr.create_server((host6(), 0), family=socket.AF_INET6)
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    ctl.send(c.smc_info().mode)
    with c:
        while data := c.recv(65536):
            c.sendall(data)


def link_local(ifname: str, timeout: float = 10.0) -> str:
    """The link-local IPv6 address of ``ifname`` in this namespace, once usable (the
    kernel makes it when the link comes up and runs duplicate address detection first)."""
    from smcr.rdma.roce.netif import ipv6_addresses  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while True:
        for name, addr, scope in ipv6_addresses():  # tentative ones are left out
            if name == ifname and scope:
                return addr
        if time.monotonic() > deadline:
            raise TimeoutError(f"no usable link-local address on {ifname}")
        time.sleep(0.05)


def echo_server_link_local(ctl: Connection, ifname: str, addr: str = "") -> None:
    """One IPv6 client on ``ifname``'s link-local address (``addr``, else the kernel's),
    echoed until EOF; reports the address and port, then the mode, the interface index
    (the scope id), and the address and scope id of the RNIC the connection used."""
    addr = addr or link_local(ifname)
    index = socket.if_nametoindex(ifname)
    srv = smcr.create_server((addr, 0, 0, index), family=socket.AF_INET6)
    ctl.send((addr, srv.getsockname()[1]))
    c, _ = srv.accept()
    ip = ipaddress.ip_address(c.getsockname()[0].split("%")[0])
    rnic = getattr(get_stack(ip).device, "info", None)
    ctl.send((c.smc_info().mode, index, rnic and (rnic.address, rnic.scope_id)))
    with c:
        while data := c.recv(65536):
            c.sendall(data)


def echo_client(ctl: Connection, address: str, port: int, size: int) -> None:
    """Connect, send ``size`` random bytes and read them back; report mode and equality."""
    with smcr.create_connection((address, port), timeout=20) as s:
        msg = os.urandom(size)
        s.sendall(msg)
        got = bytearray()
        while len(got) < size and (data := s.recv(65536)):
            got += data
        ctl.send((s.smc_info().mode, bytes(got) == msg))


def count_server(ctl: Connection, decline: bool = False, wait: bool = False) -> None:
    """Accept one client and report its mode; (with ``wait``, once told) read until EOF or an
    error; report how it ended (``"eof"`` or the errno's name), the byte count and SHA-256
    of the bytes; close."""
    if decline:
        get_stack(ipaddress.ip_address(host())).pool.max_buffers = 0  # handshakes decline: MEM
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    ctl.send(c.smc_info().mode)
    if wait:
        ctl.recv()
    h, n, end = hashlib.sha256(), 0, "eof"
    buf = bytearray(1 << 16)
    c.settimeout(20)
    try:
        while got := c.recv_into(buf):
            h.update(buf[:got])
            n += got
    except OSError as exc:
        end = errno.errorcode.get(exc.errno or 0, repr(exc))
    ctl.send((end, n, h.hexdigest()))
    c.close()
    srv.close()


def drop_server(ctl: Connection, size: int) -> None:
    """Accept one client, send ``size`` bytes of :func:`pattern`, then drop the socket without
    closing it; report the warnings its collection gave and, once the client has closed
    too, whether the runtime has let the connection go (within 10 s)."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    stack, conn_id = get_stack(ipaddress.ip_address(host())), c._hc.conn_id  # type: ignore[union-attr]
    c.sendall(pattern(size))
    ctl.send(c.smc_info().mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del c
        gc.collect()
    ctl.send([(w.category.__name__, str(w.message)) for w in caught])
    del caught  # a recorded warning holds its source, the socket: let it go now
    ctl.recv()  # the client has read everything and closed
    ctl.send(wait_released(stack, conn_id))
    srv.close()


def pattern(size: int) -> bytes:
    """``size`` bytes of a fixed pattern (the receiver checks them)."""
    return (hashlib.sha256(b"pattern").digest() * (size // 32 + 1))[:size]


def wait_released(stack: Stack, conn_id: int, timeout: float = 10.0) -> bool:
    """Whether the runtime lets connection ``conn_id`` go within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with stack.lock:
            if conn_id not in stack.conns and conn_id not in stack.engine.conns:
                return True
        time.sleep(0.01)
    return False


def eof_or_reset(sock: socket.socket) -> bytes:
    """What a client reads once its server dropped the connection: EOF (b"") or a reset,
    which it reports as b"" too; any data is returned, for the test to fail on."""
    try:
        return sock.recv(1)
    except ConnectionResetError:
        return b""


def two_conn_server(ctl: Connection) -> None:
    """Accept two clients; at each ``"go"`` send a byte on the first, then 5 ms later one on
    the second; ``"quit"`` ends."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    first, _ = srv.accept()
    second, _ = srv.accept()
    while ctl.recv() == "go":
        first.sendall(b"x")
        time.sleep(0.005)
        second.sendall(b"y")
    first.close()
    second.close()


def standby_client(ctl: Connection, port: int, rounds: int) -> None:
    """A blocking request/response client in a process of its own (its runtime has never
    watched a readiness descriptor): after each answer, whether the CQ was left armed for
    the progress thread's standby, in rounds whose answer is there before the ``recv`` (a
    2 ms pause after the request), right after an arm made while something else needed
    it, and in rounds whose answer the ``recv`` waits for; then the same after
    ``fileno()``.  Reports ``(armed in rounds before fileno(), armed right after fileno()
    or the progress thread polling, armed in rounds after)``."""
    from smcr.rdma.completion import ARM_STANDBY  # noqa: PLC0415

    conn = smcr.create_connection((host(), port), timeout=20)
    assert conn.smc_info().mode == "SMCR"
    stack = conn._stack
    assert stack is not None
    cq = stack.ex.cq

    def round_trips(pause: float = 0.0) -> int:
        armed = 0
        for i in range(rounds):
            conn.sendall(i.to_bytes(4, "big"))
            if pause:
                time.sleep(pause)
            got = b""
            while len(got) < 4:
                got += conn.recv(4 - len(got))
            assert got == i.to_bytes(4, "big")
            with stack.ex.lock:
                armed += cq._armed == ARM_STANDBY
        return armed

    with stack.ex.lock:  # (as a hand-back does while a close or a handshake is under way)
        stack.progress.arm_standby()
    before = round_trips(0.002) + round_trips()
    conn.fileno()
    with stack.ex.lock:  # (the progress thread may poll the CQ itself by now: no arm needed)
        at_fileno = cq._armed == ARM_STANDBY or stack.wake.poller == "bg"
    after = round_trips()
    conn.close()
    ctl.send((before, at_fileno, after))


def waiting_client(ctl: Connection, port: int) -> None:
    """Two threads of one client, each in a blocking ``recv`` on one of two connections
    (:func:`two_conn_server`): the first polls, the second waits on its connection's
    condition.  Reports, once the first has its byte: whether the runtime counted the
    waiting thread and would keep the CQ armed for the standby, and whether the second
    thread then had its byte; then the count once both are done."""
    first = smcr.create_connection((host(), port), timeout=20)
    second = smcr.create_connection((host(), port), timeout=20)
    stack = first._stack
    assert stack is not None and second._stack is stack
    firsts, seconds = threading.Event(), threading.Event()
    polling = threading.Thread(target=lambda: firsts.set() if first.recv(1) else None)
    polling.start()
    time.sleep(0.2)  # (it polls)
    waiting = threading.Thread(target=lambda: seconds.set() if second.recv(1) else None)
    waiting.start()
    time.sleep(0.2)  # (it waits on its condition)
    with stack.ex.lock:
        counted = stack.wake.waiting
        needed = stack.progress.standby_needed()
    ctl.send((counted, needed))
    assert ctl.recv() == "read"
    got = firsts.wait(10) and seconds.wait(10)
    polling.join(10)
    waiting.join(10)
    with stack.ex.lock:
        left = stack.wake.waiting
    ctl.send((got, left))
    first.close()
    second.close()


def loop_echo_server(ctl: Connection, conns: int) -> None:
    """Accept ``conns`` clients, then echo all of them from one ``selectors`` loop
    (non-blocking sockets, as an event loop); report, per connection, whether its
    readiness descriptor has a consumer bell and how often a peer rang it, and how often
    this process's progress thread was woken while the loop ran."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    socks = [srv.accept()[0] for _ in range(conns)]
    sel = selectors.DefaultSelector()
    pending: dict[socket.socket, bytearray] = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        pending[s] = bytearray()
    open_ = len(socks)
    woken = voluntary_switches("smcr-progress")
    while open_:
        for key, events in sel.select(30):
            s = key.fileobj  # type: ignore[assignment]
            if events & selectors.EVENT_READ:
                try:
                    data = s.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(s)
                    open_ -= 1
                    continue
                pending[s] += data
            if pending[s]:
                with contextlib.suppress(BlockingIOError):
                    del pending[s][: s.send(pending[s])]
                sel.modify(s, selectors.EVENT_READ | (selectors.EVENT_WRITE if pending[s] else 0))
    woken = voluntary_switches("smcr-progress") - woken
    bells = []
    for s in socks:
        hc = getattr(s, "_hc", None)
        bell = hc.readiness.bell if hc is not None and hc.readiness is not None else None
        bells.append(None if bell is None else bell.rung)
        s.close()
    ctl.send((bells, woken))
    srv.close()


def loop_accept_server(ctl: Connection, conns: int) -> None:
    """A connection per request, served from one ``selectors`` loop (as an event-loop web
    server): a non-blocking listener, each connection's request answered, closed at its
    EOF; ``conns`` of them.  Report how many were SMC-R and how often this process's
    progress and watcher threads were woken while the loop ran."""
    srv = smcr.create_server((host(), 0))
    srv.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    ctl.send(srv.getsockname()[1])
    threads = ("smcr-progress", "smcr-watcher")
    woken = [voluntary_switches(t) for t in threads]
    closed = smc = 0
    while closed < conns:
        for key, _ in sel.select(30):
            if key.fileobj is srv:
                with contextlib.suppress(BlockingIOError):
                    c, _ = srv.accept()
                    c.setblocking(False)
                    sel.register(c, selectors.EVENT_READ)
                    smc += c.smc_info().mode == "SMCR"
                continue
            c = key.fileobj  # type: ignore[assignment]
            try:
                data = c.recv(100)
            except BlockingIOError:
                continue
            if data:
                c.sendall(data)
            else:
                sel.unregister(c)
                c.close()
                closed += 1
    ctl.send((smc, [voluntary_switches(t) - w for t, w in zip(threads, woken, strict=True)]))
    srv.close()


def write_only_sender(ctl: Connection, size: int) -> None:
    """Accept one client and send it ``size`` bytes from a non-blocking socket that waits
    for writability only (never registered for reading, as an asyncio transport whose
    reading is paused); report "sent" when all went."""
    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    c, _ = srv.accept()
    c.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(c, selectors.EVENT_WRITE)
    data = memoryview(pattern(size))
    sent = 0
    while sent < size:
        if not sel.select(30):
            ctl.send(f"stalled at {sent}")
            return
        with contextlib.suppress(BlockingIOError):
            sent += c.send(data[sent : sent + 262144])
    ctl.send("sent")
    c.close()
    srv.close()


def handshake_count_server(ctl: Connection, conns: int) -> None:
    """Accept ``conns`` clients one after another in a blocking ``accept`` (a byte each way,
    then close); report how many were SMC-R and how many of their Confirms this process's
    ``accept`` caught without sleeping (``clc_spin_cnt``)."""
    from smcr.stack.counters import COUNTERS  # noqa: PLC0415

    srv = smcr.create_server((host(), 0))
    ctl.send(srv.getsockname()[1])
    smc = 0
    for _ in range(conns):
        c, _ = srv.accept()
        with c:
            smc += c.smc_info().mode == "SMCR"
            c.sendall(c.recv(1))
    srv.close()
    ctl.send((smc, COUNTERS.clc_spin_cnt))


def handshake_count_client(ctl: Connection, port: int, conns: int) -> None:
    """``conns`` blocking connects one after another (a byte each way, then close); report
    how many were SMC-R and how many Accepts this process caught without sleeping."""
    from smcr.stack.counters import COUNTERS  # noqa: PLC0415

    smc = sum(byte_each_way(port) == "SMCR" for _ in range(conns))
    ctl.send((smc, COUNTERS.clc_spin_cnt))


def byte_each_way(port: int) -> str:
    """A blocking connect to ``port``, a byte each way, close: the connection's mode."""
    with smcr.create_connection((host(), port), timeout=20) as c:
        c.sendall(b"x")
        assert c.recv(1) == b"x"
        return c.smc_info().mode
