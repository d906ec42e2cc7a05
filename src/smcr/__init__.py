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
"""

__version__ = "0.1.0"

# First: the compiled hot path if it is built and current, else pure Python (smcr.native).
from smcr import native

native.install()

from smcr.socket import SmcInfo, SMCSocket, create_connection, create_server  # noqa: E402
from smcr.wire.decline import DeclineCode  # noqa: E402
from smcr.wire.errors import WireError  # noqa: E402

__all__ = [
    "DeclineCode",
    "SMCSocket",
    "SmcInfo",
    "WireError",
    "__version__",
    "create_connection",
    "create_server",
]
