"""smcr: SMC-R (Shared Memory Communications over RDMA, RFC 7609) in Python.

TCP socket programs get RDMA data transfer: the connection starts as TCP, both
ends agree on an RDMA link inside the TCP stream (CLC), and the bytes travel by
RDMA WRITE into the peer's receive buffer, over software RNICs.
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
