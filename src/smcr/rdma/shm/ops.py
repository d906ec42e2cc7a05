"""The work requests an shm QP runs: what the data path needs to know of each opcode, as
plain ints, and the checks of an inline WR (:class:`~smcr.rdma.shm.qp.ShmQp`'s post)."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Final

from smcr.rdma.shm import layout as lay
from smcr.rdma.verbs import AccessFlag, SendFlag, SendWr, VerbsError, WcOpcode, WrOpcode

INLINE: Final = int(SendFlag.INLINE)
REMOTE_WRITE: Final = int(AccessFlag.REMOTE_WRITE)


@dataclass(frozen=True, slots=True)
class Op:
    """What the data path needs to know of an opcode, as plain ints."""

    kind: int  # slot kind if the WR consumes a receive, else 0
    need_local: int  # access the local SGEs need (LOCAL_WRITE for a READ's destination)
    need_remote: int  # access the peer QP and MR need; 0 for SENDs
    read: bool
    wc_opcode: WcOpcode


OPS: dict[WrOpcode, Op] = {
    WrOpcode.SEND: Op(lay.KIND_SEND, 0, 0, False, WcOpcode.SEND),
    WrOpcode.SEND_WITH_IMM: Op(lay.KIND_SEND_IMM, 0, 0, False, WcOpcode.SEND),
    WrOpcode.RDMA_WRITE: Op(0, 0, REMOTE_WRITE, False, WcOpcode.RDMA_WRITE),
    WrOpcode.RDMA_WRITE_WITH_IMM: Op(lay.KIND_WRITE_IMM, 0, REMOTE_WRITE, False,
                                      WcOpcode.RDMA_WRITE),
    WrOpcode.RDMA_READ: Op(0, int(AccessFlag.LOCAL_WRITE), int(AccessFlag.REMOTE_READ), True,
                            WcOpcode.RDMA_READ),
}  # fmt: skip


def check_inline(wr: SendWr, max_inline: int) -> None:
    """An inline WR: the flag and the data together, a byte view, within ``max_inline``
    (the QP's ``max_inline_data``)."""
    data = wr.inline_data
    if data is None or not int(wr.send_flags) & INLINE:
        raise VerbsError(errno.EINVAL, "inline_data and SendFlag.INLINE go together")
    if wr.opcode is WrOpcode.RDMA_READ:
        raise VerbsError(errno.EINVAL, "an RDMA READ cannot be inline")
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        wr.inline_data = view = view.cast("B")
    if view.nbytes > max_inline:
        raise VerbsError(errno.EINVAL, f"{view.nbytes} inline bytes above the QP's "
                         f"max_inline_data {max_inline}")  # fmt: skip
