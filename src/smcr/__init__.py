"""smcr: SMC-R (Shared Memory Communications over RDMA, RFC 7609) in Python.

TCP socket programs get RDMA data transfer: the connection starts as TCP, both
ends agree on an RDMA link inside the TCP stream (CLC), and the bytes travel by
RDMA WRITE into the peer's receive buffer, over software RNICs.  Where SMC-R
cannot be used the connection is plain TCP, and the application does not notice.

Use it as the ``socket`` module::

    srv = smcr.create_server(("0.0.0.0", 5000))   # in the server process
    conn, addr = srv.accept()

    sock = smcr.create_connection(("server", 5000))  # in the client process
    sock.sendall(b"hello")
    sock.smc_info()   # SmcInfo(mode='SMCR', ...), or mode='TCP' and the reason codes

The names: :func:`create_connection`, :func:`create_server`, :class:`SMCSocket`
(a ``socket.socket``, with :meth:`~SMCSocket.smc_info`), :class:`SmcInfo`,
:class:`DeclineCode` (Linux's reasons of a fallback), :class:`WireError`.  The
``smcr`` command (``smcr demo``, ``smcr info``, ``smcr ss``, ...) and the
documentation (docs/) tell more.

Importing ``smcr`` imports nothing else: every Python interpreter under ``smcr run``
imports it (:mod:`smcr.run`), most of them never make a TCP socket, and the socket
layer with the engine below it takes a few hundred milliseconds to import.  The names
above load with their modules when first used (PEP 562), and the choice between the
compiled modules and pure Python (:func:`smcr.native.install`) is made just before the
first of smcr's other modules is imported (:class:`_NativeFirst`).
"""

from __future__ import annotations

import _thread
import sys

__version__ = "0.1.0"

TYPE_CHECKING = False  # (typing costs milliseconds to import; mypy reads this name as True)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

    from smcr.socket import SmcInfo, SMCSocket, create_connection, create_server
    from smcr.wire.decline import DeclineCode
    from smcr.wire.errors import WireError

_PUBLIC = {"SMCSocket": "smcr.socket", "SmcInfo": "smcr.socket",
           "create_connection": "smcr.socket", "create_server": "smcr.socket",
           "DeclineCode": "smcr.wire.decline", "WireError": "smcr.wire.errors"}  # fmt: skip
"""The package's names and the module each comes from."""


def __getattr__(name: str) -> object:
    """A name of :data:`_PUBLIC`, imported on first use (then it is the module's own)."""
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module 'smcr' has no attribute {name!r}")
    import importlib  # noqa: PLC0415 - only when a name is used

    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


class _NativeFirst:
    """First on ``sys.meta_path`` from ``import smcr`` until the first import of one of
    smcr's modules other than :data:`LIGHT`: runs :func:`smcr.native.install` then, which
    must come before any compiled module (a process never mixes the two builds).  Every
    compiled module sits in a subpackage, whose ``__init__`` is imported first, so the
    decision is made before the first of them is looked for."""

    LIGHT = frozenset({"smcr.native", "smcr.run", "smcr.run.patches"})
    """Modules that ``smcr run``'s start in every interpreter imports: they import no
    compiled module and not :mod:`smcr.native` (whose check costs milliseconds)."""

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:  # fmt: skip
        if fullname.startswith("smcr.") and fullname not in self.LIGHT:
            self.choose()
        return None

    def choose(self) -> None:
        """Remove this finder and let :func:`smcr.native.install` decide (idempotent)."""
        with self.lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            from smcr import native  # noqa: PLC0415 - this is the point of the class

            native.install()


_NATIVE_FIRST = _NativeFirst()
sys.meta_path.insert(0, _NATIVE_FIRST)

__all__ = [
    "DeclineCode",
    "SMCSocket",
    "SmcInfo",
    "WireError",
    "__version__",
    "create_connection",
    "create_server",
]
