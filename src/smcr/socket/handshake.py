"""The CLC handshake of an SMC socket, from the socket's side: started on the socket's runtime
(:meth:`Stack.start_handshake`), waited for in a blocking ``connect``, and its outcome
taken: SMC-R (the socket gets its hold on the connection,
:class:`~smcr.stack.conn.SocketCalls`), a fallback to TCP with the Linux reason codes, or
a failure that resets the TCP connection (Linux ``smc_connect_*``,
``smc_listen_work``).
"""

from __future__ import annotations

import errno
import functools
import os
import socket as _socket
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

from smcr import discovery
from smcr.core import FellBack, HandshakeCompleted
from smcr.diag import registry
from smcr.diag import start as diag_start
from smcr.socket import headroom, numbers, unserved
from smcr.socket.base import (
    LINGER_ZERO,
    PlainSocket,
    SmcInfo,
    SocketBase,
    c_family,
    collected,
    parse_ip,
    smc_sockets,
)
from smcr.socket.tcphold import RuntimeTcp, TcpHold, runtime_tcp
from smcr.stack.conn import DataPath, SocketCalls
from smcr.stack.counters import COUNTERS as _C
from smcr.stack.hostconn import HostConn
from smcr.stack.progress import CLC_SPIN
from smcr.stack.runtime import Stack, get_stack
from smcr.wire.decline import DeclineCode, describe

OUT_OF_RESOURCES = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS))
"""Errors of a process out of descriptors or memory: a handshake that meets one at its start
is declined (``MEM``), never left hanging."""


def stack_here(sock: SocketBase) -> None:
    """Find the runtime of this socket's local address in the calling thread: the
    handshake may start in the watcher thread, and a thread can be in another
    network namespace than the process (``setns`` is per thread), where this
    address has no RNIC."""
    try:
        name = PlainSocket.getsockname(sock)
        ip = parse_ip(name[0])
        if not ip.is_unspecified:
            sock._stack = get_stack(ip, scope_id(name))
    except (OSError, ValueError):
        pass


def scope_id(name: Any) -> int:
    """The interface index of a socket name's link-local IPv6 address (0 otherwise)."""
    return int(name[3]) if len(name) == 4 else 0


def handshake(sock: SocketBase, client: bool) -> None:
    """The CLC handshake, waited for in this thread (blocking ``connect``).

    :raises ConnectionResetError: when it failed with no way back to TCP (the
        peer broke the CLC protocol): the TCP connection is reset.
    :raises TimeoutError: (``ETIMEDOUT``) when the server's Accept did not come in the
        CLC wait time; the TCP connection is reset too.
    """
    try:
        stack, hc = start_handshake(sock, client, None, polled=True)
    except OSError as e:
        if not decline_instead(sock, e):
            raise
        return
    deadline = None if sock._timeout is None else time.monotonic() + sock._timeout
    with stack.lock:
        if not stack.wait(hc, lambda: hc.outcome is not None, deadline, CLC_SPIN, clc=True):
            # the socket's timeout bounds connect() as a whole, as on TCP: the
            # handshake is given up (its TCP shut, so that it ends at once)
            hc.on_outcome = functools.partial(abandon, stack)
            try:
                hc.tcp.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
            sock._hc = None
            raise TimeoutError("timed out")
    finish_handshake(sock, stack, hc)
    numbers.reshow(sock)  # (SMC-R: a number given out before connect names its readiness)
    if sock._mode == "INIT":
        reason = f"SMC handshake failed: {getattr(hc.outcome, 'reason', '')}"
        if failure_errno(hc) == errno.ETIMEDOUT:
            raise TimeoutError(errno.ETIMEDOUT, f"Connection timed out ({reason})")
        raise ConnectionResetError(errno.ECONNRESET, reason)


def failure_errno(hc: HostConn) -> int:
    """The errno a client's failed handshake ends its ``connect`` with: ``ETIMEDOUT`` when
    the server's Accept did not come in the CLC wait time (Linux's ``__smc_connect`` turns
    that wait's ``-EAGAIN`` into it), else ``ECONNRESET``."""
    return errno.ETIMEDOUT if getattr(hc.outcome, "timed_out", False) else errno.ECONNRESET


def start_handshake(sock: SocketBase, client: bool,
                    on_outcome: Callable[[HostConn], None] | None,
                    polled: bool = False) -> tuple[Stack, HostConn]:  # fmt: skip
    """Start the CLC handshake; the runtime drives it (``on_outcome`` is called
    with its lock held when it ends, in whichever thread polled).

    :param polled: this thread waits for the outcome at once (:meth:`Stack.wait`),
        polling for it itself (:meth:`Stack.start_handshake`)."""
    diag_start()  # this process answers smcr ss/stats from now on (smcr.diag)
    # the RNIC of this address (and, link-local, of this interface); found already
    # where the background work may run in another thread (see :func:`stack_here`)
    name = PlainSocket.getsockname(sock)  # (once: the runtime's and the CLC watch's)
    local_ip = parse_ip(name[0])
    stack = sock._stack = sock._stack or get_stack(local_ip, scope_id(name))
    with stack.lock:
        tcp = runtime_tcp_of(sock)  # (EMFILE here: declined before anything went)
        sent = send_proposal(sock, stack, local_ip) if client and polled else None
        hc = sock._hc = stack.new_conn(tcp)
        hc.on_outcome = on_outcome
        stack.start_handshake(hc, client, local_ip, sock._rmb_size,
                              sock._sndbuf_size, polled, name, sent)  # fmt: skip
        if hc.outcome is not None and hc.on_outcome is not None:
            hc.on_outcome(hc)  # ended at once, and nobody took the news yet
    return stack, hc


def send_proposal(sock: SocketBase, stack: Stack, local_ip: Any) -> tuple[int, bool] | None:
    """A blocking ``connect``'s Proposal, sent by its thread at once (:meth:`Stack.
    early_proposal`; runtime lock held): what the runtime is to know of it, or None where
    the runtime sends it.  A failed send is left to the handshake's next read, as the
    runtime's own send leaves it."""
    early = stack.early_proposal(local_ip)
    if early is None:
        return None
    data, port, offers_v2 = early
    try:
        PlainSocket.sendall(sock, data)
    except OSError:
        pass
    return port, offers_v2


def runtime_tcp_of(sock: SocketBase) -> RuntimeTcp:
    """The runtime's socket object of ``sock``'s TCP socket, which outlives ours when the
    application closes first (the closing CDCs, then the FIN): on our descriptor, shared
    (:mod:`smcr.socket.tcphold`), unless the program was given that number, which a
    readiness descriptor takes over once the connection is SMC-R
    (:func:`~smcr.socket.numbers.reshow`): then on a descriptor of its own, which our
    socket object takes as its own there (:func:`~smcr.socket.numbers.rebind`)."""
    fd = PlainSocket.fileno(sock)
    if sock._shown == fd:
        return runtime_tcp(c_family(sock), TcpHold(os.dup(fd), app=False))
    # an SMC-R connection needs descriptors a TCP one does not (its readiness descriptor,
    # made when the program asks for one): with none to spare, EMFILE here, and the
    # handshake does not start (decline_instead), rather than a later fileno() failing;
    # probed at the top numbers (this may be the listen worker's thread: headroom.py)
    if not headroom.descriptors_free(fd, 1):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    hold = sock._tcp_hold = TcpHold(fd, app=True)
    return runtime_tcp(c_family(sock), hold)


def pay_decline(sock: SocketBase) -> None:
    """A client that fell back before its non-blocking connect had finished (out of
    descriptors, :data:`OUT_OF_RESOURCES`) owes the server the Decline (``MEM``) that
    ends a handshake the server may have started, before any byte of the program's: sent
    at the first call that moves bytes once the connection is there, if the peer offered
    SMC."""
    try:
        PlainSocket.getpeername(sock)
    except OSError:
        return  # not connected (yet, or ever): the program's call gets TCP's answer
    sock._decline_owed = False
    if discovery.current().peer_offered(sock, client=True):
        unserved.send_decline(sock, DeclineCode.MEM)


def decline_instead(sock: SocketBase, error: OSError) -> bool:
    """A client that cannot start its handshake because the process is out of descriptors
    or memory (:data:`OUT_OF_RESOURCES`: an SMC-R connection needs descriptors a TCP one
    does not, :func:`runtime_tcp_of`) tells the server so with a CLC Decline (``MEM``;
    ``NOSMCRDEV`` when its address has no RNIC, :mod:`smcr.socket.unserved`),
    which ends the server's handshake in a fallback as it ends Linux's, and goes on over
    TCP (Linux ``smc_connect_decline_fallback``).

    :returns: whether it did (False: ``error`` is another, for the caller to report).
    """
    if error.errno in unserved.NO_RNIC:  # (no RNIC for the address: NOSMCRDEV, as Linux)
        code = unserved.CODE
    elif error.errno in OUT_OF_RESOURCES:
        code = DeclineCode.MEM
    else:
        return False
    unserved.send_decline(sock, code)
    fall_back(sock, int(code), 0)
    return True


def finish_handshake(sock: SocketBase, stack: Stack, hc: HostConn) -> None:
    """Take the handshake's outcome: SMC-R, TCP fallback, or (mode stays INIT) a
    failure, after which the TCP connection is reset and closed (a server's whose
    client went away under it goes on as that TCP connection instead)."""
    outcome = hc.outcome
    hc.on_outcome = None
    server = not getattr(hc.handshake, "client", True)
    if isinstance(outcome, HandshakeCompleted):
        sock._rmb_size, sock._sndbuf_size = len(hc.rmb), len(hc.sndbuf)  # as allocated
        _C.smc_established(server, outcome.version, sock._rmb_size,
                           sock._sndbuf_size)  # fmt: skip
        sock._info = _established_info(outcome)
        path = DataPath(stack, hc)
        try:  # (set on the TCP socket before: a listener's)
            path.oob_inline = bool(PlainSocket.getsockopt(sock, _socket.SOL_SOCKET,
                                                          _socket.SO_OOBINLINE))  # fmt: skip
        except OSError:
            pass
        sock._calls = SocketCalls(path, sock._timeout)
        # collected unclosed: close as close() would (the runtime holds the TCP
        # socket and the buffers; nothing else would ever let them go)
        sock._finalizer = weakref.finalize(sock, collected, sock._calls)
        sock._finalizer.atexit = False  # at exit the runtime itself goes (module doc)
        sock._mode = "SMCR"
        sock._shadow_fast()
        smc_sockets.add(sock)
        if sock._debug:
            report(sock)
        return
    trailing = hc.trailing_data()
    sock._hc = None
    hc.tcp.close()  # the runtime lets go of it: ours goes on (TCP) or is reset
    sock._tcp_hold = None  # (ours alone now)
    try:  # (closed meanwhile: nothing to restore)
        PlainSocket.settimeout(sock, sock._timeout)  # the runtime made it non-blocking
    except OSError:
        pass
    if isinstance(outcome, FellBack):
        sock._prefix = trailing
        fall_back(sock, outcome.local_code, outcome.peer_code, server)
        return
    _C.handshake_failed(server)
    if server and getattr(outcome, "peer_gone", False):
        # the client closed or reset its TCP under the handshake: a TCP listener still
        # hands such a connection to accept(), whose reads then say what the client did
        # (Linux's SMC queues it too: smc_listen_out_err); with no other reason to give
        sock._mode = "TCP"
        sock._info = SmcInfo("TCP", state="CLOSED")
        sock._tcp_error = hc.tcp_error  # (the runtime's read took it from the kernel)
        return
    try:  # a reset, as Linux ends a broken handshake
        PlainSocket.setsockopt(sock, _socket.SOL_SOCKET, _socket.SO_LINGER, LINGER_ZERO)
    except OSError:
        pass
    PlainSocket.close(sock)


_INFOS: dict[tuple[int, bool, int], SmcInfo] = {}
"""The infos of established connections, by (group, first contact, version): an info is
frozen, and making one is a few microseconds of interpreted code per connection."""


def _established_info(outcome: HandshakeCompleted) -> SmcInfo:
    key = (outcome.lgr_id, outcome.first_contact, outcome.version)
    info = _INFOS.get(key)
    if info is None:
        if len(_INFOS) >= 1024:  # (bounded: a long-lived process makes many groups)
            _INFOS.clear()
        info = _INFOS[key] = SmcInfo("SMCR", lgr_id=outcome.lgr_id,
                                     first_contact=outcome.first_contact,
                                     version=outcome.version)  # fmt: skip
    return info


def fall_back(sock: SocketBase, local: int, peer: int, server: bool | None = False) -> None:
    """:param server: the role counted in ``smcr stats`` (None: not counted, a socket
        made from a connected descriptor)."""
    sock._mode = "TCP"
    sock._info = SmcInfo("TCP", local_code=local, peer_code=peer, state="ACTIVE")
    if server is not None:
        _C.fell_back(server, local, peer)
    registry.fallbacks.add(sock)  # seen by smcr ss (smcr.diag)
    diag_start()
    if sock._debug:
        report(sock)


def report(sock: SocketBase) -> None:
    """``smcr run -d``: one line per connection on standard error."""
    try:
        ends = f"{PlainSocket.getsockname(sock)} -> {PlainSocket.getpeername(sock)}"
    except OSError:
        ends = "(not connected)"
    how = (f"SMCR link group {sock._info.lgr_id}" if sock._mode == "SMCR"
           else f"TCP, reason {sock._info.reason} ({describe(sock._info.local_code)})")
    print(f"smcr run [{os.getpid()}]: {ends}: {how}", file=sys.stderr, flush=True)


def abandon(stack: Stack, hc: HostConn) -> None:
    """A handshake nobody waits for any more has ended (runtime's lock held): a
    connection it made is aborted, a fallback's TCP socket closed."""
    hc.on_outcome = None
    if isinstance(hc.outcome, HandshakeCompleted):
        stack.abort(hc)
    else:
        try:
            hc.tcp.close()
        except OSError:
            pass
