"""What a registered buffer costs the host: pages backed only once written, and given back
by ``MemoryRegion.discard`` (a pooled RMB or send buffer waiting for its next connection);
descriptors: one per RMB (the segment handed to peers), none for a mapping.

Memory is read from the kernel: the process's resident set (``VmRSS``) for private
memory, a shared segment's allocated blocks (``st_blocks`` of its memfd) for shared
memory, which the peer's mappings keep alive too.
"""

from __future__ import annotations

import os
import resource
from collections import Counter
from pathlib import Path

import pytest

from smcr.rdma import AccessFlag, RecvWr, SendFlag, SendWr, Sge, WcStatus, WrOpcode
from smcr.rdma.base import MemoryRegion, QueuePair
from smcr.rdma.shm import ShmDevice
from smcr.rdma.shm.segment import Segment
from tests.rdma.rdma_helpers import RW, Side, make_side

SIZE = 32 << 20


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _segment_bytes(dev: ShmDevice, mr: MemoryRegion) -> int:
    """Bytes of memory a remote-accessible MR's shared segment holds now."""
    fd = dev._remote[mr.rkey].segment.fd
    return os.fstat(fd).st_blocks * 512


def test_a_send_buffer_costs_what_is_written(shm_dir: Path) -> None:
    dev = ShmDevice("m", directory=shm_dir)
    try:
        pd = dev.alloc_pd()
        before = _rss_kib()
        mr = pd.alloc_mr(SIZE, AccessFlag.LOCAL_WRITE)
        assert _rss_kib() - before < 4096  # not 32 MiB of zeros written at once
        mr.buf[: 1 << 20] = b"x" * (1 << 20)
        grown = _rss_kib() - before
        assert 1024 <= grown < 8192
        mr.discard()
        assert _rss_kib() - before < grown - 512  # the written MiB went back
        assert bytes(mr.buf[:4096]) == bytes(4096)  # and reads as zeros
        mr.buf[:3] = b"abc"  # still usable
        assert bytes(mr.buf[:3]) == b"abc"
    finally:
        dev.close()


def test_an_rmb_segment_is_given_back_for_every_mapping(shm_dir: Path) -> None:
    dev = ShmDevice("m", directory=shm_dir)
    try:
        pd = dev.alloc_pd()
        mr = pd.alloc_mr(SIZE, RW)
        assert _segment_bytes(dev, mr) == 0  # a new segment holds nothing
        mr.buf[:SIZE] = b"y" * SIZE
        assert _segment_bytes(dev, mr) >= SIZE
        mr.discard()
        assert _segment_bytes(dev, mr) == 0
        assert bytes(mr.buf[SIZE - 8 :]) == bytes(8)
    finally:
        dev.close()


def test_a_callers_buffer_is_left_alone(shm_dir: Path) -> None:
    dev = ShmDevice("m", directory=shm_dir)
    try:
        buffer = bytearray(b"keep" * 1024)
        mr = dev.alloc_pd().reg_mr(buffer, AccessFlag.LOCAL_WRITE)
        mr.discard()
        assert buffer[:4] == b"keep"
    finally:
        dev.close()


def test_thousands_of_rmbs_fit_in_the_mr_table(shm_dir: Path) -> None:
    """Remote-accessible MRs are not capped at a number a busy server meets (1,024 was: a
    connection past it fell back with MEM); the table costs what it holds."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    dev = ShmDevice("m", directory=shm_dir)
    try:
        assert dev.attr.max_mr >= 1 << 16
        pd = dev.alloc_pd()
        mrs = [pd.alloc_mr(4096, RW) for _ in range(1500)]
        assert len({mr.rkey for mr in mrs}) == 1500
        assert os.fstat(dev.table_fd).st_blocks * 512 < 1 << 20  # (2 MiB if all backed)
        for mr in mrs:
            mr.dereg()
    finally:
        dev.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _memory_descriptors() -> Counter[str]:
    """This process's descriptors of shared memory (memfds), by name: sockets come and go
    with the QPs' background connections, memory is what the test is about."""
    out: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:"):
            out[target] += 1
    return out


def test_an_rmb_costs_one_descriptor_and_a_peer_writing_into_it_none(
    pair: tuple[Side, Side],
) -> None:
    """A mapping holds no descriptor of its own (CPython's mmap keeps a dup of the file it
    maps): an RMB costs its segment's memfd only, and a peer that maps it to write into
    it nothing, so thousands of connections do not run a process out of descriptors."""
    a, b = pair
    before = _memory_descriptors()
    rmbs = [a.pd.alloc_mr(1 << 16, RW) for _ in range(40)]
    assert _memory_descriptors() - before == Counter({"/memfd:smcr-mr (deleted)": 40})
    for i, rmb in enumerate(rmbs):
        b.buf.buf[:8] = i.to_bytes(8, "little")
        b.qp.post_send(SendWr(
            wr_id=i, opcode=WrOpcode.RDMA_WRITE, send_flags=SendFlag.SIGNALED,
            sg_list=(Sge(b.buf.addr, 8, b.buf.lkey),), remote_addr=rmb.addr + 4096,
            rkey=rmb.rkey,
        ))  # fmt: skip
        assert b.wait()[0].status is WcStatus.SUCCESS
    assert b.qp._peer is not None and len(b.qp._peer.mrs) >= 40  # b mapped every one
    assert _memory_descriptors() - before == Counter({"/memfd:smcr-mr (deleted)": 40})
    assert [int.from_bytes(rmb.buf[4096:4104], "little") for rmb in rmbs] == list(range(40))
    for rmb in rmbs:
        rmb.dereg()
    assert _memory_descriptors() == before


def _write_at(b: Side, rmb: MemoryRegion, value: int, wr_id: int = 0) -> WcStatus:
    """``b`` writes ``value`` (8 bytes) 4 KiB into ``rmb``; the completion's status."""
    b.buf.buf[:8] = value.to_bytes(8, "little")
    b.qp.post_send(SendWr(
        wr_id=wr_id, opcode=WrOpcode.RDMA_WRITE, send_flags=SendFlag.SIGNALED,
        sg_list=(Sge(b.buf.addr, 8, b.buf.lkey),), remote_addr=rmb.addr + 4096, rkey=rmb.rkey,
    ))  # fmt: skip
    return b.wait()[0].status


def test_rmbs_carved_from_one_segment_cost_one_descriptor_and_keep_apart(
    pair: tuple[Side, Side],
) -> None:
    """A link group's RMBs share a segment (:mod:`smcr.rdma.shm.segment`): 40 of them hold
    one descriptor, a peer's WRITE through each rkey lands in that RMB's own range and
    nowhere else, an RMB deregistered refuses WRITEs while the others take them, and the
    descriptor goes once the segment is let go of and its last RMB deregistered."""
    a, b = pair
    before = _memory_descriptors()
    seg = Segment("smcr-group")
    sizes = [1 << 14, 1 << 16, 1 << 20, 5000] * 10  # (5000: rounded up to pages)
    rmbs = [a.pd.alloc_mr(size, RW, seg) for size in sizes]
    assert _memory_descriptors() - before == Counter({"/memfd:smcr-group (deleted)": 1})
    assert seg.users == 40
    for i, rmb in enumerate(rmbs):
        rmb.buf[:] = bytes(rmb.length)  # (each range its own: no write spills into the next)
        assert _write_at(b, rmb, 1000 + i, i) is WcStatus.SUCCESS
    assert [int.from_bytes(rmb.buf[4096:4104], "little") for rmb in rmbs] == [
        1000 + i for i in range(40)]  # fmt: skip
    assert all(bytes(rmb.buf[:4096]) == bytes(4096) for rmb in rmbs)
    assert all(bytes(rmb.buf[4104:]) == bytes(rmb.length - 4104) for rmb in rmbs)
    assert _memory_descriptors() - before == Counter({"/memfd:smcr-group (deleted)": 1})
    gone, kept = rmbs[7], rmbs[8]
    gone.dereg()
    assert _write_at(b, kept, 7, 41) is WcStatus.SUCCESS
    assert int.from_bytes(kept.buf[4096:4104], "little") == 7
    assert _write_at(b, gone, 8, 42) is WcStatus.REM_ACCESS_ERR
    seg.close()  # the group ended: the descriptor stays for the RMBs still out
    assert _memory_descriptors() - before == Counter({"/memfd:smcr-group (deleted)": 1})
    with pytest.raises(OSError):
        seg.carve(4096)  # (nothing new goes into a segment let go of)
    for rmb in rmbs:
        rmb.dereg()
    assert _memory_descriptors() == before


def test_an_rmb_in_a_segment_is_aliased_on_a_second_device_without_a_descriptor(
    shm_dir: Path,
) -> None:
    """A second RNIC's registration of a grouped RMB maps the same range again (a peer's
    WRITE through either rkey lands in the same bytes) and holds no descriptor more."""
    one, two = ShmDevice("one", directory=shm_dir), ShmDevice("two", directory=shm_dir)
    try:
        seg = Segment("smcr-group")
        first = one.alloc_pd().alloc_mr(1 << 16, RW, seg)
        other = one.alloc_pd().alloc_mr(1 << 16, RW, seg)
        before = _memory_descriptors()
        alias = two.alloc_pd().alias_mr(other)
        assert _memory_descriptors() == before
        alias.buf[:5] = b"alias"
        assert bytes(other.buf[:5]) == b"alias" and bytes(first.buf[:5]) == bytes(5)
        seg.close()
        for mr in (first, other):
            mr.dereg()
        assert seg.users == 1 and bytes(alias.buf[:5]) == b"alias"  # the alias keeps it
        alias.dereg()
        assert seg.users == 0
    finally:
        one.close()
        two.close()


def test_a_writer_gives_back_the_whole_pages_of_a_range_of_the_peers_mr(
    pair: tuple[Side, Side],
) -> None:
    """``discard_remote``: the QP that writes into a peer's MR punches a range of it (the
    part of an idle connection's RMB the peer has read): only whole pages inside the
    range, in the peer's segment (its memory and mapping lose them, they read as zeros),
    and nothing for a range outside the MR, an MR it never wrote into (it has no mapping of
    it: a look-up would ask the peer's device), or an rkey that is no longer live."""
    a, b = pair
    rmb = a.pd.alloc_mr(1 << 16, RW)
    assert b.qp.discard_remote(rmb.rkey, rmb.addr, 1 << 16) == 0  # (not mapped by b yet)
    assert _write_at(b, rmb, 7) is WcStatus.SUCCESS
    rmb.buf[:] = b"r" * (1 << 16)  # (as if b had written all of it)
    assert _segment_bytes(a.dev, rmb) >= 1 << 16
    assert b.qp.discard_remote(rmb.rkey, rmb.addr - 4096, 8192) == 0  # starts before the MR
    assert b.qp.discard_remote(rmb.rkey, rmb.addr + 4096, 1 << 16) == 0  # ends after it
    assert b.qp.discard_remote(rmb.rkey, rmb.addr + 100, 8100) == 4096  # the one whole page
    assert bytes(rmb.buf[:4096]) == b"r" * 4096 and bytes(rmb.buf[8192:8292]) == b"r" * 100
    assert bytes(rmb.buf[4096:8192]) == bytes(4096)
    assert b.qp.discard_remote(rmb.rkey, rmb.addr + 8192, 1 << 15) == 1 << 15
    assert (1 << 16) - (1 << 15) - 4096 <= _segment_bytes(a.dev, rmb) <= (1 << 16) - (1 << 15)
    assert bytes(rmb.buf[: 1 << 12]) == b"r" * 4096  # (what was outside the ranges stays)
    assert bytes(rmb.buf[(1 << 15) + 8192 :]) == b"r" * ((1 << 15) - 8192)
    assert _write_at(b, rmb, 9) is WcStatus.SUCCESS  # a punched page takes writes again
    assert int.from_bytes(rmb.buf[4096:4104], "little") == 9
    rkey = rmb.rkey
    rmb.dereg()
    assert b.qp.discard_remote(rkey, rmb.addr, 1 << 16) == 0


def test_a_qp_that_cannot_reach_the_peers_memory_gives_nothing_back(
    pair: tuple[Side, Side], shm_dir: Path,
) -> None:
    """Before RTS there is no peer to punch yet (-1: not now); a provider whose requester
    does not map the peer's memory never can (the base class's answer, 0)."""
    a, _ = pair
    rmb = a.pd.alloc_mr(1 << 16, RW)
    side = make_side(shm_dir, "lone", 1)
    try:
        assert side.qp.discard_remote(rmb.rkey, rmb.addr, 1 << 16) == -1
        assert QueuePair.discard_remote(side.qp, rmb.rkey, rmb.addr, 1 << 16) == 0
    finally:
        side.dev.close()


def test_a_writer_whose_send_queue_waits_gives_back_nothing_now(pair: tuple[Side, Side]) -> None:
    """A WR queued behind an RNR wait may be about to write into the range: -1 (not now),
    and the pages once the queue has run."""
    a, b = pair
    rmb = a.pd.alloc_mr(1 << 16, RW)
    assert _write_at(b, rmb, 7) is WcStatus.SUCCESS
    rmb.buf[:] = b"r" * (1 << 16)
    b.buf.buf[:4] = b"wait"
    b.qp.post_send(SendWr(wr_id=1, opcode=WrOpcode.SEND, send_flags=SendFlag.SIGNALED,
                          sg_list=(Sge(b.buf.addr, 4, b.buf.lkey),)))  # (no receive posted)
    assert b.qp.discard_remote(rmb.rkey, rmb.addr, 1 << 16) == -1
    assert bytes(rmb.buf[:8]) == b"r" * 8
    a.qp.post_recv(RecvWr(wr_id=9, sg_list=(Sge(a.buf.addr, 64, a.buf.lkey),)))
    assert b.wait()[0].status is WcStatus.SUCCESS
    assert b.qp.discard_remote(rmb.rkey, rmb.addr, 1 << 16) == 1 << 16
