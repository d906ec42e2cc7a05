"""The runtime that hosts the SMC-R engine on a real RNIC (the shm device).

See :mod:`smcr.stack.runtime`.
"""

from smcr.stack.runtime import HostConn, Stack, get_stack

__all__ = ["HostConn", "Stack", "get_stack"]
