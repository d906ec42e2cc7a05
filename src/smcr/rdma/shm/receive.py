"""The responder's side of a SEND on the shm RNIC: a slot the requester placed, completed
into the receive WR it was matched with (:meth:`ShmQp._drain
<smcr.rdma.shm.qp.ShmQp._drain>`).  Functions, not methods: the receive side needs
nothing of the QP but the arguments.
"""

from __future__ import annotations

from typing import Final

from smcr.rdma.base import ProtectionDomain, scatter
from smcr.rdma.shm import layout as lay
from smcr.rdma.verbs import AccessFlag, RecvWr, WcFlag, WcOpcode, WcStatus, WorkCompletion

_LOCAL_WRITE: Final = int(AccessFlag.LOCAL_WRITE)
_WITH_IMM: Final = WcFlag.WITH_IMM
_NO_FLAGS: Final = WcFlag(0)  # an enum call per completion costs 0.5 us
_SUCCESS: Final = WcStatus.SUCCESS
_RECV: Final = WcOpcode.RECV


def deliver(pd: ProtectionDomain, area: memoryview, slot_size: int, qp_num: int, src_qp: int,
            wr: RecvWr, payload: int, byte_len: int, kind: int,
            imm: int) -> tuple[WorkCompletion, bool]:  # fmt: skip
    """Complete one receive of a QP from its slot (at ``payload`` in the QP's receive
    ``area``); returns the completion and whether it is fatal.  A function, not a method:
    the receive side needs nothing of the QP but these."""
    if kind == lay.KIND_LEN_ERR:
        return recv_wc(wr, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0, 0, qp_num, src_qp), True
    if kind == lay.KIND_WRITE_IMM:
        op = WcOpcode.RECV_RDMA_WITH_IMM
        return recv_wc(wr, WcStatus.SUCCESS, op, byte_len, imm, qp_num, src_qp), False
    if kind not in (lay.KIND_SEND, lay.KIND_SEND_IMM):
        # the shared area is written by the peer: never trust it further than checked
        return recv_wc(wr, WcStatus.LOC_QP_OP_ERR, WcOpcode.RECV, 0, 0, qp_num, src_qp), True
    sges = wr.sg_list
    if kind == lay.KIND_SEND and sges and byte_len <= slot_size:
        # the data path (a CDC that fits the first buffer: the runtime's receives have a
        # second, for the longer SMC-Rv2 LLC messages): lookup_local inlined, no lists
        sge = sges[0]
        mr = pd.mrs.get(sge.lkey)
        off = sge.addr - mr.addr if mr is not None else -1
        if (mr is not None and mr.valid and mr.access_bits & _LOCAL_WRITE and off >= 0
                and byte_len <= sge.length and off + sge.length <= mr.length):  # fmt: skip
            mr.buf[off : off + byte_len] = area[payload : payload + byte_len]
            return WorkCompletion(wr_id=wr.wr_id, status=_SUCCESS, opcode=_RECV, qp_num=qp_num,
                                  byte_len=byte_len, src_qp=src_qp), False  # fmt: skip
    views: list[memoryview] = []
    room = 0
    lookup = pd.lookup_local
    for sge in wr.sg_list:
        v = lookup(sge, _LOCAL_WRITE)
        if v is None:
            return recv_wc(wr, WcStatus.LOC_PROT_ERR, WcOpcode.RECV, 0, 0, qp_num, src_qp), True
        views.append(v)
        room += sge.length
    if byte_len > slot_size or byte_len > room:
        return recv_wc(wr, WcStatus.LOC_LEN_ERR, WcOpcode.RECV, 0, 0, qp_num, src_qp), True
    scatter(views, 0, area[payload : payload + byte_len])
    return recv_wc(wr, WcStatus.SUCCESS, WcOpcode.RECV, byte_len,
                   imm if kind == lay.KIND_SEND_IMM else 0, qp_num, src_qp), False  # fmt: skip


def recv_wc(wr: RecvWr, st: WcStatus, op: WcOpcode, n: int, imm: int, qp_num: int,
            src_qp: int) -> WorkCompletion:  # fmt: skip
    """A receive's completion."""
    with_imm = op is WcOpcode.RECV_RDMA_WITH_IMM or bool(imm)
    return WorkCompletion(
        wr_id=wr.wr_id, status=st, opcode=op, qp_num=qp_num, byte_len=n,
        imm_data=imm, wc_flags=_WITH_IMM if with_imm else _NO_FLAGS, src_qp=src_qp,
    )  # fmt: skip
