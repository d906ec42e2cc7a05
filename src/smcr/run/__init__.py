"""``smcr run``: unmodified Python programs use SMC-R (the role of Linux's ``smc_run``).

How.  ``smcr run COMMAND`` starts COMMAND with a directory of smcr's at the
front of ``PYTHONPATH`` that holds a ``sitecustomize`` module: every Python
interpreter started below it (COMMAND itself, its ``subprocess`` children,
``multiprocessing`` workers of any start method) runs :func:`install` before
the program's first line, then the ``sitecustomize`` it would have run
otherwise.  A forked child inherits the installed interpreter as it is.

What :func:`install` changes.  ``socket.socket`` becomes a subclass of
:class:`smcr.SMCSocket`: every AF_INET/AF_INET6 stream socket the program
makes is an SMC socket, and discovery decides per connection whether SMC-R
is used (:mod:`smcr.discovery`); other sockets (AF_UNIX, UDP, socketpair)
behave exactly as before.  ``isinstance(s, socket.socket)`` holds for every
socket, made before or after, and for ``ssl.SSLSocket`` too.  When the ``ssl``
module is imported, ``SSLContext.wrap_socket`` of a socket in SMC-R mode
returns a TLS socket whose records travel over SMC-R (:mod:`smcr.run.tls`);
asyncio's own TLS runs over its transports and so over SMC-R already.

What it does not reach: programs that are not Python (their own children
that are Python are covered); ``python -S``/``-I`` (no ``site``, so no
hook); sockets wrapped by ``ssl`` before they connect (they connect as plain
TCP, as the ``ssl`` module drives the descriptor itself).

Environment (set by ``smcr run``, read by :func:`install`): ``SMCR_RUN``
(``1``: install), ``SMC_RCVBUF`` and ``SMC_SNDBUF`` (RMB and send buffer
sizes, as Linux's smc_run names them), ``SMCR_RUN_DEBUG`` (``1``: a line on
standard error for each connection: its mode and, for TCP, the reason),
``SMCR_RUN_EAGER`` (``0``: the runtime starts with the first socket, not with
the interpreter; see :func:`_start_runtime`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import io
import os
import socket
import sys
import types
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from typing import Any

from smcr import settings

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "boot")
"""The directory whose ``sitecustomize`` installs smcr in every Python started below."""


class _AnySocket(type):
    """Metaclass of the class that replaces ``socket.socket``: every socket object (of the
    standard library's class, ssl's, ours) is an instance of it, as it was of the original."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _ORIGINAL)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _ORIGINAL)


_ORIGINAL = socket.socket


def parse_size(text: str) -> int:
    """``65536``, ``64k``, ``1m`` -> bytes (smc_run's ``-r``/``-t``).

    :raises ValueError: for anything else, or a size outside 16 KiB .. 1 GiB.
    """
    try:
        return settings.buffer_size(text)
    except ValueError:
        raise ValueError(f"buffer size {text!r} is not allowed: expected 16k .. 1024m "
                         "(k, m suffixes)") from None


def installed() -> bool:
    """Whether this interpreter runs with smcr installed."""
    return getattr(socket.socket, "_smcr_run", False) is True


def install() -> None:
    """Make every new AF_INET/AF_INET6 stream socket an SMC socket (module docstring).
    Idempotent; the buffer sizes and debug output come from the environment."""
    if installed():
        return
    from smcr import socket as smc_socket  # noqa: PLC0415 - not before install is asked for
    from smcr.socket.base import bufsize  # noqa: PLC0415

    rmb = os.environ.get("SMC_RCVBUF")
    sndbuf = os.environ.get("SMC_SNDBUF")
    namespace: dict[str, Any] = {"_smcr_run": True, "__module__": "socket",
                                 "__qualname__": "socket", "__doc__": _ORIGINAL.__doc__}
    if rmb:
        namespace["default_rmb_size"] = bufsize(parse_size(rmb))
    if sndbuf:
        namespace["default_sndbuf_size"] = bufsize(parse_size(sndbuf))
    if os.environ.get("SMCR_RUN_DEBUG") == "1":
        namespace["_debug"] = True
    run_socket = _AnySocket("socket", (smc_socket.SMCSocket,), namespace)
    socket.socket = run_socket  # type: ignore[misc, assignment]
    waiting = {name for name in _PATCHES if name not in sys.modules}
    for name in _PATCHES.keys() - waiting:
        _PATCHES[name](sys.modules[name])
    if waiting:
        sys.meta_path.insert(0, _PatchingFinder(waiting))
    if os.environ.get("SMCR_RUN_EAGER", "1") != "0":
        _start_runtime()


def _start_runtime() -> None:
    """Start the runtime with the interpreter: the watcher thread, the default RNIC's
    runtime and the diag endpoint, whose threads otherwise start with the program's
    first SMC socket.  Programs and test harnesses that count threads
    (``threading.active_count()``, ``_thread._count()``: CPython's own tests wait for
    the count to come back after each test) then see a steady count, as they would
    without smcr.  Costs each interpreter a few milliseconds at start
    (``SMCR_RUN_EAGER=0`` leaves it to the first socket).  A failure is left for
    that first socket to meet."""
    from smcr import diag  # noqa: PLC0415
    from smcr.stack.runtime import get_stack  # noqa: PLC0415
    from smcr.stack.watcher import get_watcher  # noqa: PLC0415

    try:
        get_watcher()
        get_stack()
        diag.start()
    except (OSError, ValueError):
        pass


def _patch_ssl(ssl: types.ModuleType) -> None:
    from smcr.run.tls import patch  # noqa: PLC0415 - only once ssl is there

    patch(ssl)


def _patch_asyncio(unix_events: types.ModuleType) -> None:
    """asyncio's ``sock_sendfile`` (and ``loop.sendfile`` of its transports) calls
    ``os.sendfile`` on ``sock.fileno()``, which for an SMC-R socket is smcr's readiness
    descriptor, not the connection: for such sockets its "native" sendfile reads the
    file (``os.pread``, the file position untouched until the end, as ``os.sendfile``
    leaves it) and sends it with ``sock_sendall``.  Native, not asyncio's fallback: a
    transport's ``write`` during the transfer raises "sendfile is in progress", as over
    TCP, and the same files are refused (``SendfileNotAvailableError``), as is every file
    where ``os.sendfile`` is missing."""
    from asyncio import exceptions  # noqa: PLC0415

    from smcr.socket import SMCSocket  # noqa: PLC0415

    loop_class = unix_events._UnixSelectorEventLoop
    native = loop_class._sock_sendfile_native

    async def sock_sendfile_native(self: Any, sock: Any, file: Any, offset: int,
                                   count: int | None) -> int:  # fmt: skip
        if not (isinstance(sock, SMCSocket) and sock.smc_mode in ("SMCR", "CONNECTING")):
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


_PATCHES = {"ssl": _patch_ssl, "asyncio.unix_events": _patch_asyncio}
"""Modules that ``smcr run`` adjusts, each once it is imported (:class:`_PatchingFinder`)."""


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """Patches modules of :data:`_PATCHES` when the program imports them (importing them
    up front would cost every Python process under ``smcr run`` milliseconds)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> ModuleSpec | None:  # fmt: skip
        if fullname not in self.names:
            return None
        self.names.discard(fullname)
        if not self.names:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: types.ModuleType) -> None:
            # ssl's SSLSocket must subclass the standard library's socket class (it
            # drives the descriptor in C), not ours: give it that one while it loads
            ours = socket.socket
            socket.socket = _ORIGINAL  # type: ignore[misc]
            try:
                exec_module(module)
            finally:
                socket.socket = ours  # type: ignore[misc]
            _PATCHES[fullname](module)

        loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec
