"""The runtime that hosts the SMC-R engine on a real RNIC (shm, or RoCE by ``SMCR_RNIC``).

See :mod:`smcr.stack.runtime` and, for the RNIC choice, :mod:`smcr.stack.devices`.
"""

from smcr.stack.hostconn import HostConn
from smcr.stack.runtime import Stack, close_stacks, get_stack

__all__ = ["HostConn", "Stack", "close_stacks", "get_stack"]
