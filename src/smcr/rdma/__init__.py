"""The RDMA verbs model of smcr and its software RNICs.

Provider-independent pieces: :mod:`smcr.rdma.verbs` (enums, work requests,
completions, attributes, with libibverbs names and values),
:mod:`smcr.rdma.qpstate` (the RC state table), :mod:`smcr.rdma.base`
(device, PD, MR, CQ and QP bookkeeping) and :mod:`smcr.rdma.eventloop` (every
RNIC's progress thread: descriptors, peer death, timers).  Providers: :mod:`smcr.rdma.shm`
(same host, shared memory) and :mod:`smcr.rdma.roce` (across hosts, RoCEv2
over UDP, wire-compatible with Linux rxe).
"""

from smcr.rdma.base import (
    Device,
    KeyAllocator,
    MemoryRegion,
    ProtectionDomain,
    QueuePair,
)
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.qpstate import TRANSITIONS, check_modify, rc_bring_up, transition_masks
from smcr.rdma.verbs import (
    REMOTE_ACCESS,
    RNR_TIMER_SECONDS,
    AccessFlag,
    AhAttr,
    AsyncEvent,
    AsyncEventType,
    DeviceAttr,
    PathMtu,
    PortState,
    QpAttr,
    QpAttrMask,
    QpCap,
    QpState,
    QpType,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    VerbsError,
    WcFlag,
    WcOpcode,
    WcStatus,
    WorkCompletion,
    WrOpcode,
    ipv4_mapped_gid,
    local_ack_timeout,
    psn_add,
    psn_diff,
)

__all__ = [
    "REMOTE_ACCESS",
    "RNR_TIMER_SECONDS",
    "TRANSITIONS",
    "AccessFlag",
    "AhAttr",
    "AsyncEvent",
    "AsyncEventType",
    "CompletionQueue",
    "Device",
    "DeviceAttr",
    "KeyAllocator",
    "MemoryRegion",
    "PathMtu",
    "PortState",
    "ProtectionDomain",
    "QpAttr",
    "QpAttrMask",
    "QpCap",
    "QpState",
    "QpType",
    "QueuePair",
    "RecvWr",
    "SendFlag",
    "SendWr",
    "Sge",
    "VerbsError",
    "WcFlag",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WrOpcode",
    "check_modify",
    "ipv4_mapped_gid",
    "local_ack_timeout",
    "psn_add",
    "psn_diff",
    "rc_bring_up",
    "transition_masks",
]
