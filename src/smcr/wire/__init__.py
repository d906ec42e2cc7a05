"""Byte-exact codecs for every SMC-R message, as Linux ``net/smc`` sends them.

Immutable objects <-> bytes; every decoder raises only :class:`WireError`.
Submodules: ``tcpopt`` (the SMC TCP option), ``clc`` (CLC handshake messages),
``llc`` (link-layer control), ``cdc`` (connection data control and cursors),
``roce`` (RoCEv2 BTH/RETH/AETH/ImmDt and ICRC).
"""

from smcr.wire.decline import DeclineCode, describe
from smcr.wire.errors import WireError

__all__ = ["DeclineCode", "WireError", "describe"]
