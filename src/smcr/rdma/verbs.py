"""The provider-independent verbs vocabulary: enums, work requests, completions, attributes.

Design: every provider (the same-host ``shm`` RNIC now, a user-space RoCEv2 RNIC
next) speaks these types, so the SMC-R core never sees a provider.  Names and
numeric values are libibverbs' (``verbs.h``) as listed in ``shared/spec/rocev2.md``
§7-§8, so that code and traces read one-to-one against rdma-core and a future
``pyverbs`` provider can pass the values straight through.  Wire-sized fields keep
their wire widths: GIDs are 16 bytes (IPv6 or IPv4-mapped), QPNs and PSNs 24 bits.

Work requests, SGEs and completions are slotted dataclasses but deliberately
*not* frozen: they sit on the data path, and CPython 3.11 builds a frozen one
about three times slower (``object.__setattr__`` per field: 4.5 µs against
1.4 µs for a 9-field record on the reference machine), more than a whole RDMA
WRITE costs.  Treat them as immutable: a provider may keep a posted WR until it
completes (verbs copies it at post time; we save that copy), so do not change
a WR after posting it.  Those made per message (:class:`Sge`, :class:`SendWr`,
:class:`RecvWr`, :class:`WorkCompletion`) write their ``__init__`` out: the compiled build
then makes them without the interpreter (a dataclass's generated ``__init__`` is
interpreted code even in a compiled module).  Attribute records (QpAttr, AhAttr...) are
off the data path and frozen where nothing needs to change them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

from smcr._mypyc import mypyc_attr

#: QPNs and PSNs are 24-bit quantities on the wire (BTH), spec §2.1.
QPN_MASK: Final = 0xFFFFFF
PSN_MASK: Final = 0xFFFFFF
GID_LEN: Final = 16


@mypyc_attr(native_class=False)
class VerbsError(OSError):
    """A verbs call that the provider refused, as libibverbs returns an errno.

    Why an ``OSError``: rdma-core reports refusals of ``ibv_modify_qp``,
    ``ibv_post_send`` and friends as errno values (EINVAL, ENOMEM, ...), and the
    socket layer above maps errnos anyway.  Faults of *remote* operations never
    raise: they arrive as :class:`WorkCompletion` statuses, as in verbs.

    :param errno_: the errno value (``errno.EINVAL`` etc.).
    :param reason: what was refused, in words.
    """

    def __init__(self, errno_: int, reason: str) -> None:
        super().__init__(errno_, reason)
        self.reason = reason


class AccessFlag(enum.IntFlag):
    """``ibv_access_flags`` (spec §8.1): what an MR or a QP lets a peer do."""

    NONE = 0
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4
    REMOTE_ATOMIC = 8
    MW_BIND = 16
    ZERO_BASED = 32


#: The flags that make an MR or QP reachable by a peer.
REMOTE_ACCESS = AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ | AccessFlag.REMOTE_ATOMIC


class QpState(enum.IntEnum):
    """``ibv_qp_state`` (spec §7.1).  SQD/SQE exist for completeness; RC uses ERR."""

    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    SQD = 4
    SQE = 5
    ERR = 6


class QpType(enum.IntEnum):
    """``ibv_qp_type``; only RC is provided (SMC-R uses one RC QP per link)."""

    RC = 2


class PathMtu(enum.IntEnum):
    """``ibv_mtu`` (spec §3.1): the enum 1..5, not bytes; see :attr:`nbytes`."""

    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5

    @property
    def nbytes(self) -> int:
        """The MTU in bytes (``128 << value``)."""
        return 128 << int(self)


class PortState(enum.IntEnum):
    """``ibv_port_state``: SMC-R only uses ports that are ACTIVE."""

    NOP = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4


class WrOpcode(enum.IntEnum):
    """``ibv_wr_opcode`` (spec §8.1); atomics and MW ops are not provided."""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6
    LOCAL_INV = 7
    BIND_MW = 8
    SEND_WITH_INV = 9


class WcOpcode(enum.IntEnum):
    """``ibv_wc_opcode`` (spec §8.1); ``RECV`` has bit 7 set, as in verbs."""

    SEND = 0
    RDMA_WRITE = 1
    RDMA_READ = 2
    COMP_SWAP = 3
    FETCH_ADD = 4
    BIND_MW = 5
    LOCAL_INV = 6
    RECV = 128
    RECV_RDMA_WITH_IMM = 129


#: The completion opcode a successful send-queue WR reports (spec §8.2).
WC_OPCODE_OF: dict[WrOpcode, WcOpcode] = {
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
}


class WcStatus(enum.IntEnum):
    """``ibv_wc_status`` (spec §8.1), with the libibverbs names minus ``IBV_WC_``."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    LOC_RDD_VIOL_ERR = 14
    REM_INV_RD_REQ_ERR = 15
    REM_ABORT_ERR = 16
    INV_EECN_ERR = 17
    INV_EEC_STATE_ERR = 18
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


class WcFlag(enum.IntFlag):
    """``ibv_wc_flags`` (spec §8.1)."""

    NONE = 0
    GRH = 1
    WITH_IMM = 2
    IP_CSUM_OK = 4
    WITH_INV = 8


class SendFlag(enum.IntFlag):
    """``ibv_send_flags`` (spec §8.1).  SMC-R sends CDC/LLC ``SIGNALED | SOLICITED``."""

    NONE = 0
    FENCE = 1
    SIGNALED = 2
    SOLICITED = 4
    INLINE = 8


class QpAttrMask(enum.IntFlag):
    """``ibv_qp_attr_mask`` (spec §7.2): which :class:`QpAttr` fields a modify sets."""

    STATE = 1
    CUR_STATE = 1 << 1
    EN_SQD_ASYNC_NOTIFY = 1 << 2
    ACCESS_FLAGS = 1 << 3
    PKEY_INDEX = 1 << 4
    PORT = 1 << 5
    QKEY = 1 << 6
    AV = 1 << 7
    PATH_MTU = 1 << 8
    TIMEOUT = 1 << 9
    RETRY_CNT = 1 << 10
    RNR_RETRY = 1 << 11
    RQ_PSN = 1 << 12
    MAX_QP_RD_ATOMIC = 1 << 13
    ALT_PATH = 1 << 14
    MIN_RNR_TIMER = 1 << 15
    SQ_PSN = 1 << 16
    MAX_DEST_RD_ATOMIC = 1 << 17
    PATH_MIG_STATE = 1 << 18
    CAP = 1 << 19
    DEST_QPN = 1 << 20


class AsyncEventType(enum.IntEnum):
    """``ibv_event_type`` values a provider may raise outside any completion."""

    CQ_ERR = 0
    QP_FATAL = 1
    QP_REQ_ERR = 2
    QP_ACCESS_ERR = 3
    COMM_EST = 4
    DEVICE_FATAL = 8
    PORT_ACTIVE = 9
    PORT_ERR = 10


#: RNR timer codes in seconds (spec §5.4); code 0 is the *longest* wait.
RNR_TIMER_SECONDS: tuple[float, ...] = tuple(
    ms / 1000.0
    for ms in (
        655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12,
        0.16, 0.24, 0.32, 0.48, 0.64, 0.96, 1.28, 1.92,
        2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
        40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52,
    )
)  # fmt: skip


def local_ack_timeout(timeout: int) -> float | None:
    """Seconds of the requester's retransmit timer, ``4.096 µs * 2**timeout`` (spec §7.3).

    :param timeout: the 5-bit QP attribute; 0 means "never retransmit".
    :returns: the period in seconds, or ``None`` for an infinite wait.
    """
    if timeout == 0:
        return None
    return 4.096e-6 * (1 << timeout)


def psn_add(psn: int, n: int) -> int:
    """``psn + n`` modulo 2**24 (spec §5.1)."""
    return (psn + n) & PSN_MASK


def psn_diff(a: int, b: int) -> int:
    """Signed 24-bit difference ``a - b`` (spec §5.1: compare PSNs as a signed difference)."""
    d = (a - b) & PSN_MASK
    return d - (1 << 24) if d & 0x800000 else d


IPV4_MAPPED_PREFIX: Final = bytes(10) + b"\xff\xff"
"""The first 12 bytes of an IPv4-mapped GID (``::ffff:0:0/96``)."""


def ipv4_mapped_gid(ip: bytes) -> bytes:
    """The RoCEv2 GID ``::ffff:a.b.c.d`` of an IPv4 address (spec §9).

    :param ip: four address bytes.
    """
    if len(ip) != 4:
        raise ValueError("an IPv4 address has four bytes")
    return IPV4_MAPPED_PREFIX + ip


@dataclass(slots=True, init=False)
class Sge:
    """One scatter/gather element: ``length`` bytes at ``addr`` inside the MR of ``lkey``.

    ``addr`` is the MR's virtual address space (:attr:`MemoryRegion.addr` plus an
    offset), as in verbs, so that the same numbers can travel in a RETH later.
    """

    addr: int
    length: int
    lkey: int

    def __init__(self, addr: int, length: int, lkey: int) -> None:
        self.addr = addr
        self.length = length
        self.lkey = lkey


@dataclass(slots=True, kw_only=True, init=False)
class SendWr:
    """A send-queue work request (``ibv_send_wr``).

    :param wr_id: the caller's 64-bit cookie, returned in the completion.
    :param opcode: SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM or RDMA_READ.
    :param sg_list: local buffers (source, or destination for a READ).
    :param send_flags: SIGNALED asks for a success completion; errors always complete.
    :param remote_addr: peer virtual address for RDMA operations.
    :param rkey: peer MR key for RDMA operations.
    :param imm_data: 32-bit immediate for the ``*_WITH_IMM`` opcodes.
    :param inline_data: with ``SendFlag.INLINE`` (SEND or RDMA WRITE), the payload
        itself, read once while ``post_send`` runs and free to reuse when it
        returns; ``sg_list`` is then ignored.  ibverbs reads an inline WR's
        ``sg_list`` memory at post time without lkey checks; Python has no raw
        pointers, so the buffer travels instead.  At most the QP's
        ``max_inline_data`` bytes (a provider that supports none raises EINVAL).
    """

    wr_id: int
    opcode: WrOpcode
    sg_list: tuple[Sge, ...] = ()
    send_flags: SendFlag = SendFlag.NONE
    remote_addr: int = 0
    rkey: int = 0
    imm_data: int = 0
    inline_data: bytes | bytearray | memoryview | None = None

    def __init__(self, *, wr_id: int, opcode: WrOpcode, sg_list: tuple[Sge, ...] = (),
                 send_flags: SendFlag = SendFlag.NONE, remote_addr: int = 0, rkey: int = 0,
                 imm_data: int = 0,
                 inline_data: bytes | bytearray | memoryview | None = None) -> None:  # fmt: skip
        self.wr_id = wr_id
        self.opcode = opcode
        self.sg_list = sg_list
        self.send_flags = send_flags
        self.remote_addr = remote_addr
        self.rkey = rkey
        self.imm_data = imm_data
        self.inline_data = inline_data


@dataclass(slots=True, kw_only=True, init=False)
class RecvWr:
    """A receive-queue work request (``ibv_recv_wr``): where the next SEND lands."""

    wr_id: int
    sg_list: tuple[Sge, ...] = ()

    def __init__(self, *, wr_id: int, sg_list: tuple[Sge, ...] = ()) -> None:
        self.wr_id = wr_id
        self.sg_list = sg_list


@dataclass(slots=True, kw_only=True, init=False)
class WorkCompletion:
    """A completion (``ibv_wc``, spec §8).

    On a flush only ``wr_id``, ``status`` and ``qp_num`` are meaningful, as in verbs.
    The ``__init__`` is written out (not the dataclass's) so that the compiled build makes
    one without the interpreter: a receive makes one per message.
    """

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    qp_num: int
    byte_len: int = 0
    imm_data: int = 0
    wc_flags: WcFlag = WcFlag.NONE
    src_qp: int = 0
    vendor_err: int = 0

    def __init__(self, *, wr_id: int, status: WcStatus, opcode: WcOpcode, qp_num: int,
                 byte_len: int = 0, imm_data: int = 0, wc_flags: WcFlag = WcFlag.NONE,
                 src_qp: int = 0, vendor_err: int = 0) -> None:  # fmt: skip
        self.wr_id = wr_id
        self.status = status
        self.opcode = opcode
        self.qp_num = qp_num
        self.byte_len = byte_len
        self.imm_data = imm_data
        self.wc_flags = wc_flags
        self.src_qp = src_qp
        self.vendor_err = vendor_err


@dataclass(frozen=True, slots=True, kw_only=True)
class AhAttr:
    """The address vector of an RC QP (``ibv_ah_attr`` with its GRH, spec §7.3)."""

    dgid: bytes = bytes(GID_LEN)
    sgid_index: int = 0
    hop_limit: int = 1
    traffic_class: int = 0
    flow_label: int = 0
    is_global: bool = True
    dmac: bytes = bytes(6)
    port_num: int = 1


@dataclass(slots=True, kw_only=True)
class QpAttr:
    """QP attributes (``ibv_qp_attr``); a modify reads the fields its mask names.

    Defaults are pyverbs' ``QPAttr()`` ones (spec §7.3), so code ported from
    pyverbs behaves alike; note ``timeout = 0`` means "never retransmit".
    """

    qp_state: QpState = QpState.INIT
    cur_qp_state: QpState = QpState.RESET
    path_mtu: PathMtu = PathMtu.MTU_1024
    qp_access_flags: AccessFlag = AccessFlag.NONE
    pkey_index: int = 0
    port_num: int = 1
    ah_attr: AhAttr = field(default_factory=AhAttr)
    dest_qp_num: int = 0
    rq_psn: int = 0
    sq_psn: int = 0
    timeout: int = 0
    retry_cnt: int = 0
    rnr_retry: int = 0
    min_rnr_timer: int = 0
    max_rd_atomic: int = 0
    max_dest_rd_atomic: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QpCap:
    """Queue sizes of a QP (``ibv_qp_cap``); Linux SMC-R asks 48/48/2/2/0 (smc-r.md §8)."""

    max_send_wr: int = 48
    max_recv_wr: int = 48
    max_send_sge: int = 2
    max_recv_sge: int = 2
    max_inline_data: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceAttr:
    """What a device supports (a slice of ``ibv_device_attr`` and ``ibv_port_attr``)."""

    max_qp_wr: int
    max_sge: int
    max_cqe: int
    max_mr: int
    max_mr_size: int
    max_msg_sz: int
    max_qp_rd_atom: int
    active_mtu: PathMtu
    max_inline_data: int = 0
    """The largest ``QpCap.max_inline_data`` a QP may ask for (0: no inline sends)."""


@dataclass(frozen=True, slots=True)
class AsyncEvent:
    """An asynchronous event (``ibv_async_event``): e.g. a QP went fatal with no WR to tell."""

    event_type: AsyncEventType
    qp_num: int | None = None
    reason: str = ""
