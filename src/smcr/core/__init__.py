"""The SMC-R protocol engine, sans-IO: fed events with ``now``, returns actions.

See :mod:`smcr.core.engine` for the contract.
"""

from smcr.core.close import CloseInput, SmcState
from smcr.core.config import Config, LocalIdentity, Port
from smcr.core.connection import Connection, Rmb
from smcr.core.engine import Engine
from smcr.core.events import (
    Action,
    ConnectionReset,
    DestroyQp,
    Event,
    FellBack,
    HandshakeCompleted,
    HandshakeFailed,
    LinkAdded,
    LinkGroupTerminated,
    LinkRemoved,
    LlcDropped,
    NextHop,
    PostSend,
    Provider,
    QpToRtr,
    QpToRts,
    RdmaWrite,
    ReleaseConnection,
    ReuseRmb,
    SendClc,
    ShutdownTcp,
)
from smcr.core.handshake import HsState
from smcr.core.linkgroup import LgrType, LinkGroup, LinkState, Role

__all__ = [
    "Action",
    "CloseInput",
    "Config",
    "Connection",
    "ConnectionReset",
    "DestroyQp",
    "Engine",
    "Event",
    "FellBack",
    "HandshakeCompleted",
    "HandshakeFailed",
    "HsState",
    "LgrType",
    "LinkGroup",
    "LinkAdded",
    "LinkGroupTerminated",
    "LinkRemoved",
    "LinkState",
    "LlcDropped",
    "LocalIdentity",
    "NextHop",
    "Port",
    "PostSend",
    "Provider",
    "QpToRtr",
    "QpToRts",
    "RdmaWrite",
    "ReleaseConnection",
    "ReuseRmb",
    "Rmb",
    "Role",
    "SendClc",
    "ShutdownTcp",
    "SmcState",
]
