"""SMC-Rv2 LLC messages longer than a receive slot reach the engine whole (the runtime's
receives scatter into a per-QP tail buffer, as Linux's second SGE into its v2 buffer)."""

from __future__ import annotations

from smcr.core.events import PostSend
from smcr.rdma import AccessFlag
from smcr.rdma.verbs import SendFlag, SendWr, Sge, WrOpcode
from smcr.stack import runtime, wrslots
from smcr.stack.hostconn import StackTap
from tests.stack.hosts import conn, connect, hosts, read, send

# frame 15 of shared/golden/linux-6.12-smcr-v2-rxe.pcap: the kernel server's ADD LINK v2
# offer at first contact, 88 bytes (its rkey list included)
ADD_LINK_V2 = bytes.fromhex(
    "22580000525400990012000000000000000000000000ffff0a63000c000012020328ab2500000000000000"
    "00800000000000000000000000ffff0a63000c00000000000000000100000003a4000005bcff45874b4277"
    "0000"
)


def test_an_88_byte_add_link_v2_keeps_the_link() -> None:
    """A peer's ADD LINK v2 (88 bytes, longer than a receive slot): the client takes it
    (and, with one RNIC, rejects it) and the link carries on.  With one 64-byte SGE per
    receive the RNIC refused it (LOC_LEN_ERR), which ended the link and its connections:
    seen live when the Linux kernel offered its second link (tests/interop)."""
    assert len(ADD_LINK_V2) == 88 > wrslots.SLOT
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)  # x the server, y the client
        qpn = conn(x, hx).qpn
        with x.lock:
            mr = x.pd.reg_mr(bytearray(ADD_LINK_V2), AccessFlag.LOCAL_WRITE)
            sge = Sge(mr.addr, len(ADD_LINK_V2), mr.lkey)
            x.qps[qpn].post_send([SendWr(wr_id=1 << 60, opcode=WrOpcode.SEND,
                                         send_flags=SendFlag.NONE, sg_list=(sge,))])  # fmt: skip
        send(x, hx, b"after the offer")
        assert read(y, hy, 15) == b"after the offer"
        c = conn(y, hy)
        assert not c.aborted and not c.reset_reason, c.reset_reason


def test_a_message_longer_than_a_send_slot_goes_whole_even_at_the_ring_end() -> None:
    """The runtime sending an SMC-Rv2 LLC message longer than a send slot (ADD LINK v2
    with its rkeys, 88 bytes and more): it takes as many slots as it needs, never past
    the ring's end (where one slot's room refused it), and the peer gets it whole, then
    the CDCs that follow."""
    with hosts(2) as (x, y):
        hx, hy = connect(x, y)
        qpn = conn(x, hx).qpn
        seen: list[bytes] = []

        class Record(StackTap):
            """The LLC messages of ADD_LINK_V2's type the engine is about to get."""

            def received(self, stack: runtime.Stack, qpn: int,
                         messages: list[memoryview]) -> None:  # fmt: skip
                seen.extend(bytes(m) for m in messages if m[0] == ADD_LINK_V2[0])

        y.tap = Record()
        with x.lock:
            # the send slots, as a RoCE RNIC uses them (the shm RNIC's inline fused
            # batches carry the CDC in the WR itself)
            x.ex.fused = False
            x.wr.send_off = len(x.wr.send_mr.buf) - wrslots.SLOT  # the ring's last slot
            x.execute([PostSend(qpn, ADD_LINK_V2, 1 << 60, signaled=False)])
            assert x.wr.send_off == 2 * wrslots.SLOT  # it went from the ring's start
        send(x, hx, b"after the offer")
        assert read(y, hy, 15) == b"after the offer"
        assert seen == [ADD_LINK_V2]
        assert not conn(y, hy).reset_reason
