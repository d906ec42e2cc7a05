"""Who may reach a shm device's memory: the rendezvous is open to every user of the
network namespace (its abstract name), so each answer is bound to the QP it names.

These are the rejection paths of :mod:`smcr.rdma.shm.device` and
:meth:`smcr.rdma.shm.qp.ShmQp.accept_inbound`, driven with raw rendezvous messages
as a stranger on the host would send them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import struct
from pathlib import Path

import pytest

from smcr.rdma import AccessFlag, VerbsError
from smcr.rdma.shm import rendezvous as rdv
from smcr.rdma.shm.segment import Segment
from tests.rdma.rdma_helpers import RW, Side, make_side


def ask(side: Side, msg: rdv.Message) -> rdv.Message:
    """One request to ``side``'s device by its abstract name; descriptors closed."""
    answer, fds = rdv.request(rdv.abstract_address(side.dev.gid), msg)
    for fd in fds:
        os.close(fd)
    return answer


def test_a_device_is_reached_by_its_abstract_name_from_any_directory(
        shm_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    """A requester whose directory lacks the device's path (another user, a private /run)
    reaches it by the abstract name; a GID nobody listens on is unreachable."""
    side = make_side(shm_dir, "a", 1)
    try:
        sock, address = rdv.connect_any(tmp_path, side.dev.gid)
        sock.close()
        assert address == rdv.abstract_address(side.dev.gid)
        sock, address = rdv.connect_any(shm_dir, side.dev.gid)
        sock.close()
        assert address == side.dev.path
        with pytest.raises(VerbsError) as exc:
            rdv.connect_any(tmp_path, rdv.new_gid())
        assert exc.value.errno == errno.EHOSTUNREACH
    finally:
        side.dev.close()
    with pytest.raises(VerbsError):
        rdv.connect(rdv.abstract_address(side.dev.gid))


def test_a_hello_to_a_qp_at_rtr_must_come_from_its_destination(pair: tuple[Side, Side]) -> None:
    """Another QPN or another GID than the QP's destination is refused (EPERM)."""
    a, b = pair
    for src_qpn, src_gid in [(a.qp.qp_num ^ 1, a.dev.gid), (a.qp.qp_num, rdv.new_gid())]:
        answer = ask(b, rdv.Message(rdv.HELLO, a=src_qpn, b=b.qp.qp_num, gid=src_gid))
        assert (answer.kind, answer.a) == (rdv.NACK, errno.EPERM)


def test_before_rtr_one_hello_is_taken_and_rtr_refuses_an_impostor(shm_dir: Path) -> None:
    """A stranger's hello to a QP not yet at RTR is the only one taken; the QP's RTR then
    finds it is not from its destination and fails, so the QP is never used."""
    a, b = make_side(shm_dir, "a", 1), make_side(shm_dir, "b", 2)
    try:
        stranger, _ = rdv.connect_any(shm_dir, b.dev.gid)
        rdv.send(stranger, rdv.Message(rdv.HELLO, a=77, b=b.qp.qp_num, gid=rdv.new_gid()))
        got = rdv.receive(stranger)
        assert got is not None and got[0].kind == rdv.HELLO_OK
        for fd in got[1]:
            os.close(fd)
        with pytest.raises(VerbsError) as exc:  # the real peer's hello finds the place taken
            a.qp.to_rts(dgid=b.dev.gid, dest_qp_num=b.qp.qp_num, rq_psn=2, sq_psn=1,
                        access=RW)  # fmt: skip
        assert exc.value.errno == errno.ECONNREFUSED
        with pytest.raises(VerbsError) as exc:
            b.qp.to_rts(dgid=a.dev.gid, dest_qp_num=a.qp.qp_num, rq_psn=1, sq_psn=2,
                        access=RW)  # fmt: skip
        assert exc.value.errno == errno.EPERM
        stranger.close()
    finally:
        a.dev.close()
        b.dev.close()


def test_an_mr_goes_only_to_a_connection_of_its_pd_and_a_refusal_revokes(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    """No token: EPERM.  The token of a's connection: b's RMB, not an MR of b's other PD;
    after one refused look-up the token is dead (one rkey guess per connection)."""
    a, b = pair
    peer = a.qp._peer
    assert peer is not None and peer.token
    assert ask(b, rdv.Message(rdv.GET_MR, a=b.rmb.rkey)).kind == rdv.NACK
    assert ask(b, rdv.Message(rdv.GET_MR, a=b.rmb.rkey, gid=peer.token)).kind == rdv.MR_OK
    other = b.dev.alloc_pd().alloc_mr(4096, RW)
    answer = ask(b, rdv.Message(rdv.GET_MR, a=other.rkey, gid=peer.token))
    assert (answer.kind, answer.a) == (rdv.NACK, errno.ENOENT)
    answer = ask(b, rdv.Message(rdv.GET_MR, a=b.rmb.rkey, gid=peer.token))
    assert (answer.kind, answer.a) == (rdv.NACK, errno.EPERM)
    other.dereg()


def test_the_shared_mr_table_names_no_rkey(shm_dir: Path) -> None:
    """Every peer maps the MR table: its entries carry a seal, never the rkey itself."""
    side = make_side(shm_dir, "a", 1)
    try:
        mrs = [side.pd.alloc_mr(4096, AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_READ)
               for _ in range(8)]  # fmt: skip
        table = bytes(side.dev._table)
        for mr in [side.rmb, *mrs]:
            assert struct.pack("<I", mr.rkey) not in table
        for mr in mrs:
            mr.dereg()
    finally:
        side.dev.close()


def _memfds() -> int:
    """This process's memfd descriptors (sockets come and go with the QPs' background
    connections; the segments a look-up receives are memfds)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (closed meanwhile)
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
    return count


def test_an_mr_at_an_offset_is_answered_with_it_and_a_bad_answer_maps_nothing(
        pair: tuple[Side, Side]) -> None:  # fmt: skip
    """An RMB carved behind another in a segment is answered MR_AT with its offset, and
    the requester maps just its range.  An answer whose offset is not a page's, or whose
    range runs past the segment, is refused (no mapping, the descriptor closed): the
    requester's WRITE fails as for an unknown rkey, it does not write elsewhere."""
    a, b = pair
    seg = Segment("smcr-group")
    first, second = (b.pd.alloc_mr(1 << 16, RW, seg) for _ in range(2))
    peer = a.qp._peer
    assert peer is not None
    answer, fds = rdv.request(rdv.abstract_address(b.dev.gid),
                              rdv.Message(rdv.GET_MR, a=second.rkey, gid=peer.token))  # fmt: skip
    for fd in fds:
        os.close(fd)
    assert answer.kind == rdv.MR_AT and rdv.OFFSET.unpack(answer.gid)[0] == 1 << 16
    mapped = peer.lookup(second.rkey)
    assert mapped is not None and len(mapped.mm) == 1 << 16
    second.buf[:4] = b"here"
    assert bytes(mapped.view[:4]) == b"here"
    first_mapped = peer.lookup(first.rkey)
    assert first_mapped is not None and bytes(first_mapped.view[:4]) == bytes(4)
    before = _memfds()
    published = b.dev._remote[second.rkey]
    for offset in (100, 1 << 17, 1 << 40):  # not a page's; past the segment's end
        # (the device answers what it has published: here, a lie about where)
        b.dev._remote[second.rkey] = dataclasses.replace(published, offset=offset)
        assert peer.lookup(second.rkey) is None
    assert _memfds() == before  # (the segments received were closed)
    b.dev._remote[second.rkey] = published
    seg.close()
