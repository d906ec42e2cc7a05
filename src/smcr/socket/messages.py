"""``sendmsg``, ``recvmsg``, ``recvmsg_into`` and ``sendfile`` of a socket in SMC-R mode, made
of the connection's sends and reads (:class:`~smcr.stack.conn.SocketCalls`), with the
argument checks ``socket.socket``'s C code makes.
"""

from __future__ import annotations

import errno
import os
import socket as _socket
from collections.abc import Callable
from typing import Any

from smcr.socket.base import OOB, PEEK, WAITALL
from smcr.stack.conn import SocketCalls, byte_view
from smcr.stack.counters import COUNTERS

GATHER_JOIN = 65536
"""``sendmsg`` joins buffers up to this many bytes in all: one send (and CDC), not one each."""
SENDFILE_CHUNK = 1 << 18
"""``sendfile`` reads this much at a time (the stdlib's send fallback: 8 KiB, one send each)."""


def sendmsg(calls: SocketCalls, family: int, buffers: Any, args: tuple[Any, ...]) -> int:
    """``sendmsg(buffers[, ancdata[, flags[, address]]])``: the buffers' bytes in order.

    A blocking socket sends everything (or, with a timeout, what went before it
    expired), a non-blocking one what fits, as the kernel's ``sendmsg`` does.  Control
    messages cannot travel over SMC-R: any ``ancdata`` raises ``EINVAL``, TCP's error for
    a control message it cannot take (Linux SMC ignores them).  ``address`` is ignored,
    as by a connected TCP socket.
    """
    if len(args) > 3:
        raise TypeError(f"sendmsg() takes at most 4 arguments ({len(args) + 1} given)")
    ancdata = list(args[0]) if args else []
    flags = args[1] if len(args) > 1 else 0
    if not isinstance(flags, int):
        raise TypeError(f"'{type(flags).__name__}' object cannot be interpreted as an integer")
    if len(args) > 2 and args[2] is not None and not isinstance(args[2], tuple):
        raise TypeError(f"{'AF_INET' if family == _socket.AF_INET else 'AF_INET6'} "
                        f"address must be tuple, not {type(args[2]).__name__}")  # fmt: skip
    views = [byte_view(b) for b in buffers]
    for item in ancdata:  # checked as the C code checks them, then refused
        if not isinstance(item, tuple) or len(item) != 3:
            raise TypeError("[sendmsg() ancillary data items]() argument must be sequence "
                            "of length 3")  # fmt: skip
        level, kind, data = item
        if not isinstance(level, int) or not isinstance(kind, int):
            raise TypeError("an integer is required")
        byte_view(data)
    if ancdata:
        raise OSError(errno.EINVAL, "control messages are not supported over SMC-R")
    size = sum(len(v) for v in views)
    if len(views) > 1 and size <= GATHER_JOIN:
        views = [memoryview(b"".join(views))]  # one CDC for many small buffers
    total = 0
    for buffer in views:
        view = buffer
        while view:
            try:
                n = calls.check().send(view, int(flags), calls.timeout)
            except (BlockingIOError, TimeoutError):
                if total:
                    return total
                raise
            total += n
            view = view[n:]
    return total


def recvmsg(recv: Callable[[int, int], bytes], bufsize: int, ancbufsize: int, flags: int) -> tuple[
        bytes, list[tuple[int, int, bytes]], int, Any]:  # fmt: skip
    """``socket.recvmsg`` made of the socket's ``recv``: ``(data, [], msg_flags, None)`` (no
    control messages over SMC-R; no address on a connected stream)."""
    if bufsize < 0:
        raise ValueError("negative buffer size in recvmsg()")
    if ancbufsize < 0:
        raise ValueError("invalid ancillary data buffer length")
    data = recv(bufsize, flags)
    return data, [], int(flags) & OOB if data else 0, None


def recvmsg_into(recv_into: Callable[[Any, int, int], int], buffers: Any, ancbufsize: int,
                 flags: int) -> tuple[
        int, list[tuple[int, int, bytes]], int, Any]:  # fmt: skip
    """``socket.recvmsg_into``: fills ``buffers`` in order; ``(nbytes, [], msg_flags, None)``.
    One buffer is read into directly; several are filled one after another as far as
    bytes are there (the first waits as ``recv_into`` does, MSG_WAITALL waits for all),
    or from one copy for MSG_PEEK/MSG_OOB."""
    if ancbufsize < 0:
        raise ValueError("invalid ancillary data buffer length")
    flags = int(flags)
    views = [v for v in (byte_view(b) for b in buffers) if v]
    got = 0
    if len(views) == 1:
        got = recv_into(views[0], 0, flags)
    elif views and flags & (PEEK | OOB):
        tmp = bytearray(sum(len(v) for v in views))
        n = recv_into(tmp, 0, flags)
        for view in views:
            part = min(n - got, len(view))
            view[:part] = tmp[got : got + part]
            got += part
    else:
        for view in views:
            try:
                n = recv_into(view, 0, flags if not got or flags & WAITALL
                                    else flags | _socket.MSG_DONTWAIT)  # fmt: skip
            except OSError:
                if got:  # what came is returned; the error shows on the next call
                    break
                raise
            got += n
            if n < len(view):
                break
    return got, [], flags & OOB if got else 0, None


def sendfile(calls: SocketCalls, file: Any, offset: int, count: int | None) -> int:
    """``socket.sendfile``: ``count`` bytes (default: to EOF) of ``file`` from ``offset``;
    returns the bytes sent and leaves the file position behind them.

    ``fileno()`` of an SMC-R socket is a readiness descriptor, so ``os.sendfile`` cannot
    be used: the file is read in chunks into one buffer and sent from it (the stdlib's
    ``_sendfile_use_send``, with its checks).  Like ``os.sendfile`` it starts at
    ``offset`` even when that is 0 and the file position is elsewhere (where the file can
    seek); a file that cannot seek (a pipe) is read from where it is, and not sought
    afterwards (the stdlib fails there).
    """
    COUNTERS.sendfile_cnt += 1
    if "b" not in getattr(file, "mode", "b"):
        raise ValueError("file should be opened in binary mode")
    if count is not None:
        if not isinstance(count, int):
            raise TypeError(f"count must be a positive integer (got {count!r})")
        if count <= 0:
            raise ValueError(f"count must be a positive integer (got {count!r})")
    if calls.timeout == 0.0:
        raise ValueError("non-blocking sockets are not supported")
    calls.check()  # EBADF when closed
    seekable = getattr(file, "seekable", None)
    seekable = seekable is not None and seekable()
    if offset or seekable:
        file.seek(offset)
    buf = bytearray(min(count, SENDFILE_CHUNK) if count else SENDFILE_CHUNK)
    chunk = memoryview(buf)
    readinto = getattr(file, "readinto", None)
    total = 0
    try:
        while count is None or total < count:
            want = len(buf) if count is None else min(len(buf), count - total)
            if readinto is not None:
                n = readinto(chunk[:want])
            else:
                data = file.read(want)
                n = len(data)
                chunk[:n] = data
            if not n:
                break
            view = chunk[:n]
            while view:
                sent = calls.check().send(view, 0, calls.timeout)  # (closed meanwhile: EBADF)
                total += sent
                view = view[sent:]
        return total
    finally:
        if total > 0 and seekable:
            file.seek(offset + total)


def sendfile_size(file: Any) -> int:
    """The size of ``file`` as ``os.sendfile`` would see it, or ``_GiveupOnSendfile`` where
    ``os.sendfile`` refuses it (the caller, the stdlib, falls back)."""
    try:
        return os.fstat(file.fileno()).st_size
    except (AttributeError, OSError) as err:
        raise _socket._GiveupOnSendfile(err) from err  # type: ignore[attr-defined]
