"""The shm RNIC's semantics tests, run unchanged on the RoCEv2 RNIC (over loopback).

The test functions are imported from ``tests/rdma/test_shm_semantics.py``;
pytest collects them here, where :func:`pair` gives two RoCE RNICs (127.0.0.1
and 127.0.0.2) with the same shape of :class:`~tests.rdma.rdma_helpers.Side`.
Passing means the code built on the shm RNIC sees the same verbs behaviour on
this one.  Left out: tests that build shm devices themselves or test shm
internals (shared segments, rendezvous sockets, peer-death notification, which
RoCE does not have: a destroyed peer is noticed by retransmission timeouts).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from smcr.rdma import AccessFlag
from smcr.rdma.roce import RoceDevice
from tests.rdma.rdma_helpers import RW, Side
from tests.rdma.test_shm_semantics import (
    test_deregistered_mr_is_refused_at_once,
    test_large_write_wraps_psn,
    test_local_protection_error,
    test_modify_to_err_flushes_and_posts_flush,
    test_protection_faults_write_nothing,
    test_rdma_read,
    test_rnr_waits_then_delivers,
    test_send_longer_than_receive,
    test_send_scatters_into_two_sges_and_imm,
    test_write_then_send_two_sges,
)
from tests.roce.test_loopback import pytestmark as loopback_marks

pytestmark = loopback_marks

__all__ = [
    "test_deregistered_mr_is_refused_at_once",
    "test_large_write_wraps_psn",
    "test_local_protection_error",
    "test_modify_to_err_flushes_and_posts_flush",
    "test_protection_faults_write_nothing",
    "test_rdma_read",
    "test_rnr_waits_then_delivers",
    "test_send_longer_than_receive",
    "test_send_scatters_into_two_sges_and_imm",
    "test_write_then_send_two_sges",
]


def roce_side(address: str, psn: int) -> Any:
    """A :class:`Side` whose objects come from a RoCE RNIC (duck-typed for the shm tests)."""
    dev = RoceDevice(address)
    pd = dev.alloc_pd()
    cq = dev.create_cq()
    qp = pd.create_qp(cq, cq)
    rmb = pd.alloc_mr(1 << 16, RW)
    buf = pd.alloc_mr(1 << 16, AccessFlag.LOCAL_WRITE)
    return Side(dev, pd, cq, qp, rmb, buf, psn)  # type: ignore[arg-type]


@pytest.fixture
def pair() -> Iterator[tuple[Side, Side]]:
    """Two connected RoCE sides with the shm fixture's PSNs and Linux SMC-R QP attributes."""
    a, b = roce_side("127.0.0.1", 0x100), roce_side("127.0.0.2", 0xFFFFF0)
    for me, other in ((a, b), (b, a)):
        me.qp.to_rts(dgid=other.dev.gid, dest_qp_num=other.qp.qp_num, rq_psn=other.psn,
                     sq_psn=me.psn, access=RW)  # fmt: skip
    yield a, b
    a.dev.close()
    b.dev.close()
