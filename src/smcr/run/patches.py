"""What ``smcr run`` changes in modules other than ``socket``: ``ssl`` and asyncio's
``unix_events``, each when the program imports it (importing them up front would cost
every Python process under ``smcr run`` milliseconds).  The patches import nothing of smcr
until an SMC socket exists (:mod:`smcr.socket` is imported): most programs never make one.
"""

from __future__ import annotations

import io
import os
import socket
import sys
from importlib.machinery import PathFinder

TYPE_CHECKING = False  # (typing costs milliseconds to import; mypy reads this name as True)
if TYPE_CHECKING:
    import types
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from typing import Any


def patch_ssl(ssl_module: types.ModuleType) -> None:
    """Make ``ssl_module.SSLContext.wrap_socket`` wrap SMC sockets in SMC-R mode (and
    listening ones) with :class:`smcr.run.tls.SmcTlsSocket` (idempotent)."""
    context_class = ssl_module.SSLContext
    base = context_class.sslsocket_class
    if getattr(base, "_smcr_tls", False):
        return

    class RunSSLSocket(base):  # type: ignore[valid-type, misc]
        _smcr_tls = True

        @classmethod
        def _create(cls, sock: Any, server_side: bool = False,
                    do_handshake_on_connect: bool = True, suppress_ragged_eofs: bool = True,
                    server_hostname: str | None = None, context: Any = None,
                    session: Any = None) -> Any:  # fmt: skip
            if "smcr.socket" in sys.modules:  # (else there is no SMC socket)
                from smcr.run import tls  # noqa: PLC0415

                wrapped = tls.wrap_smc(sock, server_side, do_handshake_on_connect,
                                       suppress_ragged_eofs, server_hostname, context,
                                       session)  # fmt: skip
                if wrapped is not None:
                    return wrapped
            return base._create(sock, server_side, do_handshake_on_connect,
                                suppress_ragged_eofs, server_hostname, context, session)

    RunSSLSocket.__name__ = RunSSLSocket.__qualname__ = base.__name__
    context_class.sslsocket_class = RunSSLSocket


def patch_asyncio(unix_events: types.ModuleType) -> None:
    """asyncio's ``sock_sendfile`` (and ``loop.sendfile`` of its transports) calls
    ``os.sendfile`` on ``sock.fileno()``, which for an SMC-R socket is smcr's readiness
    descriptor, not the connection: for such sockets its "native" sendfile reads the
    file (``os.pread``, the file position untouched until the end, as ``os.sendfile``
    leaves it) and sends it with ``sock_sendall``.  Native, not asyncio's fallback: a
    transport's ``write`` during the transfer raises "sendfile is in progress", as over
    TCP, and the same files are refused (``SendfileNotAvailableError``), as is every file
    where ``os.sendfile`` is missing."""
    from asyncio import exceptions  # noqa: PLC0415 - asyncio is there by now

    loop_class = unix_events._UnixSelectorEventLoop
    native = loop_class._sock_sendfile_native

    async def sock_sendfile_native(self: Any, sock: Any, file: Any, offset: int,
                                   count: int | None) -> int:  # fmt: skip
        if not _smc_r(sock):
            return int(await native(self, sock, file, offset, count))
        if not hasattr(unix_events.os, "sendfile"):  # (as the native path: asyncio's tests
            raise exceptions.SendfileNotAvailableError(  # patch it away to see the fallback)
                "os.sendfile() is not available")
        try:
            fileno = file.fileno()
            size = os.fstat(fileno).st_size
        except (AttributeError, io.UnsupportedOperation, OSError) as err:
            raise exceptions.SendfileNotAvailableError("not a regular file") from err
        if not (count or size):
            return 0  # empty file
        total = 0  # bytes the socket took: the file position behind them, also on errors
        try:
            while count is None or total < count:
                want = _SENDFILE_PIECE if count is None else min(_SENDFILE_PIECE, count - total)
                view = memoryview(os.pread(fileno, want, offset + total))
                if not view:
                    break
                while view:
                    try:
                        n = sock.send(view)
                    except (BlockingIOError, InterruptedError):
                        await _writable(self, sock)
                        continue
                    total += n
                    view = view[n:]
        finally:
            if total:
                os.lseek(fileno, offset + total, os.SEEK_SET)
        return total

    loop_class._sock_sendfile_native = sock_sendfile_native


async def _writable(loop: Any, sock: Any) -> None:
    """Until ``sock`` is writable (the event loop watching its ``fileno()``)."""
    fut = loop.create_future()
    fd = sock.fileno()
    loop.add_writer(fd, lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        loop.remove_writer(fd)


_SENDFILE_PIECE = 1 << 18
"""Bytes of the file read and sent at a time by asyncio's sendfile over SMC-R."""


def _smc_r(sock: object) -> bool:
    """Whether ``sock`` is an SMC socket in SMC-R mode, or on its way there (there is
    none before :mod:`smcr.socket` is imported)."""
    if "smcr.socket" not in sys.modules:
        return False
    from smcr.socket import SMCSocket  # noqa: PLC0415 - imported already

    return isinstance(sock, SMCSocket) and sock.smc_mode in ("SMCR", "CONNECTING")


PATCHES: dict[str, Callable[[types.ModuleType], None]] = {
    "ssl": patch_ssl, "asyncio.unix_events": patch_asyncio}
"""Modules that ``smcr run`` adjusts, each once it is imported (:class:`PatchingFinder`)."""


def install() -> None:
    """Patch the modules of :data:`PATCHES`: those imported now at once, the others when
    they are (:func:`smcr.run.install` runs this after it replaced ``socket.socket``)."""
    waiting = {name for name in PATCHES if name not in sys.modules}
    for name in PATCHES.keys() - waiting:
        PATCHES[name](sys.modules[name])
    if waiting:
        sys.meta_path.insert(0, PatchingFinder(waiting))


class PatchingFinder:
    """Patches modules of :data:`PATCHES` when the program imports them.  A finder of
    ``sys.meta_path`` by its ``find_spec`` alone: ``importlib.abc`` takes longer to import
    than the rest of ``smcr run``'s start."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.plain = getattr(socket.socket, "_smcr_plain", socket.socket)

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> ModuleSpec | None:  # fmt: skip
        if fullname not in self.names:
            return None
        self.names.discard(fullname)
        if not self.names:
            sys.meta_path.remove(self)
        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: types.ModuleType) -> None:
            # ssl's SSLSocket must subclass the standard library's socket class (it
            # drives the descriptor in C), not ours: give it that one while it loads
            ours = socket.socket
            socket.socket = self.plain  # type: ignore[misc]
            try:
                exec_module(module)
            finally:
                socket.socket = ours  # type: ignore[misc]
            PATCHES[fullname](module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec
