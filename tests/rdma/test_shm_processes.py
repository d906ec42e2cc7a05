"""The shm RNIC between two real processes (the peer runs ``tests.rdma.shm_peer.peer_main``).

Covers the issue's proofs: WRITE-then-SEND ordering, RDMA READ, RNR, protection
faults that write nothing, a deregistered MR, peer SIGKILL, and no leaked
segments or descriptors.  Every wait is bounded (pipes are polled with a
timeout, joins have timeouts), so a broken provider fails the test, never hangs it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

from smcr.rdma import AccessFlag, QpState, RecvWr, SendFlag, SendWr, Sge, WcStatus, WrOpcode
from smcr.rdma.shm import layout as lay
from tests.rdma.rdma_helpers import RW, Side, make_side
from tests.rdma.shm_peer import RMB_SIZE, enter_new_netns, peer_main

CTX = mp.get_context("spawn")
SIG = SendFlag.SIGNALED


@dataclass
class Peer:
    """The child process and the pipe to it."""

    proc: BaseProcess
    conn: Connection
    info: dict[str, Any]

    def ask(self, *cmd: Any, timeout: float = 10.0) -> Any:
        """Send a command and wait (bounded) for the answer."""
        self.conn.send(cmd)
        assert self.conn.poll(timeout), f"peer did not answer {cmd[0]}"
        return self.conn.recv()

    def close(self) -> None:
        """Ask the peer to close, then reap it (killing it if it does not exit)."""
        if self.proc.is_alive():
            with contextlib.suppress(OSError, EOFError, AssertionError):
                self.ask("close")
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.proc.close()  # releases multiprocessing's sentinel pipes
        self.conn.close()


def start(shm_dir: Path, local: Side, qp_access: AccessFlag = RW,
          rmb_access: AccessFlag = RW, netns: bool = False, **options: Any) -> Peer:  # fmt: skip
    """Start a peer, exchange (GID, QPN, PSN, rkey, addr) and bring both QPs to RTS."""
    parent, child = CTX.Pipe()
    proc = CTX.Process(target=peer_main, args=(child, str(shm_dir), int(qp_access),
                                                int(rmb_access), netns), daemon=True)  # fmt: skip
    proc.start()
    child.close()
    assert parent.poll(20), "peer did not start"
    info = parent.recv()
    parent.send({"gid": local.dev.gid, "qpn": local.qp.qp_num, "psn": local.psn})
    local.qp.to_rts(dgid=info["gid"], dest_qp_num=info["qpn"], rq_psn=info["psn"],
                    sq_psn=local.psn, access=qp_access, **options)  # fmt: skip
    assert parent.poll(10) and parent.recv() == "up"
    return Peer(proc, parent, info)


@pytest.fixture
def local(shm_dir: Path) -> Iterator[Side]:
    side = make_side(shm_dir, "local", 0x777)
    yield side
    side.dev.close()


@pytest.fixture
def peer(shm_dir: Path, local: Side) -> Iterator[Peer]:
    p = start(shm_dir, local)
    yield p
    p.close()


def write_wr(local: Side, peer: Peer, off: int, n: int, src_off: int = 0, wr_id: int = 1,
             flags: SendFlag = SendFlag.NONE, rkey: int | None = None) -> SendWr:  # fmt: skip
    return SendWr(wr_id=wr_id, opcode=WrOpcode.RDMA_WRITE, send_flags=flags,
                  sg_list=(Sge(local.buf.addr + src_off, n, local.buf.lkey),),
                  remote_addr=peer.info["addr"] + off,
                  rkey=peer.info["rkey"] if rkey is None else rkey)  # fmt: skip


def send_wr(local: Side, src_off: int, n: int, wr_id: int) -> SendWr:
    return SendWr(wr_id=wr_id, opcode=WrOpcode.SEND, send_flags=SIG,
                  sg_list=(Sge(local.buf.addr + src_off, n, local.buf.lkey),))  # fmt: skip


def test_write_then_send_ordering(local: Side, peer: Peer) -> None:
    """Each SEND's receive completion finds the data of the WRITE posted before it."""
    rounds = 40
    assert peer.ask("post_recv", rounds) == "ok"
    for i in range(rounds):
        stamp = i.to_bytes(8, "big")
        local.buf.buf[0:4096] = stamp * 512  # the "data": 4 KiB of the round number
        local.buf.buf[0x8000:0x8008] = stamp  # the "CDC": announces round i
        local.qp.post_send([write_wr(local, peer, 0, 4096), send_wr(local, 0x8000, 44, i)])
        assert local.wait()[0].status is WcStatus.SUCCESS
    got = peer.ask("wait", rounds, 10.0, 0, 8)
    assert len(got) == rounds
    for i, (wr_id, status, byte_len, _imm, seen, data) in enumerate(got):
        assert (wr_id, status, byte_len) == (i, "SUCCESS", 44)
        assert int.from_bytes(data, "big") == i
        # the RMB held round i's data or a later round's, never an earlier one
        assert int.from_bytes(seen, "big") >= i


def test_rdma_read_across_processes(local: Side, peer: Peer) -> None:
    """READ the peer's RMB into local memory."""
    assert peer.ask("fill", 0x5A) == "ok"
    local.qp.post_send(SendWr(wr_id=3, opcode=WrOpcode.RDMA_READ, send_flags=SIG,
                              sg_list=(Sge(local.buf.addr, 4096, local.buf.lkey),
                                       Sge(local.buf.addr + 8192, 100, local.buf.lkey)),
                              remote_addr=peer.info["addr"] + 17,
                              rkey=peer.info["rkey"]))  # fmt: skip
    (wc,) = local.wait()
    assert (wc.status, wc.byte_len) == (WcStatus.SUCCESS, 4196)
    assert bytes(local.buf.buf[:4096]) == b"\x5a" * 4096
    assert bytes(local.buf.buf[8192:8292]) == b"\x5a" * 100


def test_rnr_across_processes(local: Side, peer: Peer) -> None:
    """A SEND waits for the peer's receive (RNR retry), then completes on both sides."""
    local.buf.buf[0x8000:0x8008] = b"rnr-test"
    local.qp.post_send(send_wr(local, 0x8000, 8, 5))
    assert local.cq.wait(0.2) == []
    assert peer.ask("post_recv", 1) == "ok"
    assert local.wait()[0].status is WcStatus.SUCCESS
    (got,) = peer.ask("wait", 1, 5.0, 0, 0)
    assert got[1] == "SUCCESS" and got[5] == b"rnr-test"


def test_rnr_exhausted_across_processes(shm_dir: Path, local: Side) -> None:
    """With rnr_retry=1 and no receive the SEND fails RNR_RETRY_EXC_ERR."""
    p = start(shm_dir, local, rnr_retry=1)
    try:
        local.qp.post_send(send_wr(local, 0, 8, 6))
        (wc,) = local.wait(timeout=5.0)
        assert wc.status is WcStatus.RNR_RETRY_EXC_ERR
        assert local.qp.state is QpState.ERR
    finally:
        p.close()


FAULTS = {
    "bad_rkey": (RW, RW, WcStatus.REM_ACCESS_ERR),
    "out_of_bounds": (RW, RW, WcStatus.REM_ACCESS_ERR),
    "mr_without_remote_write": (RW, AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_READ,
                                WcStatus.REM_ACCESS_ERR),
    "qp_without_remote_write": (AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_READ, RW,
                                WcStatus.REM_INV_REQ_ERR),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FAULTS))
def test_protection_faults_across_processes(shm_dir: Path, local: Side, case: str) -> None:
    """Each violation fails on the requester, moves both QPs to ERR and writes nothing."""
    qp_access, rmb_access, expected = FAULTS[case]
    p = start(shm_dir, local, qp_access=qp_access, rmb_access=rmb_access)
    try:
        assert p.ask("fill", 0x11) == "ok"
        local.buf.buf[:64] = b"\xee" * 64
        off, rkey = 0, None
        if case == "bad_rkey":
            rkey = p.info["rkey"] ^ 0x00F0F000
        if case == "out_of_bounds":
            off = RMB_SIZE - 32
        local.qp.post_send(write_wr(local, p, off, 64, rkey=rkey))
        (wc,) = local.wait()
        assert wc.status is expected
        assert local.qp.state is QpState.ERR
        assert p.ask("rmb", 0, RMB_SIZE) == b"\x11" * RMB_SIZE
        deadline = time.monotonic() + 2.0
        while p.ask("state") != "ERR":
            assert time.monotonic() < deadline, "peer QP did not go to ERR"
            time.sleep(0.01)
    finally:
        p.close()


def test_deregistered_mr_across_processes(local: Side, peer: Peer) -> None:
    """Writes succeed, the peer deregisters, the next write fails and changes nothing."""
    local.buf.buf[:4] = b"live"
    local.qp.post_send(write_wr(local, peer, 0, 4, flags=SIG))
    assert local.wait()[0].status is WcStatus.SUCCESS
    assert peer.ask("rmb", 0, 4) == b"live"
    assert peer.ask("dereg") == "ok"
    local.buf.buf[:4] = b"dead"
    local.qp.post_send(write_wr(local, peer, 0, 4, flags=SIG))
    assert local.wait()[0].status is WcStatus.REM_ACCESS_ERR


def _fds() -> set[str]:
    """Open descriptors, each with what it points at (a number alone may be reused)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the descriptor listdir itself used
            out.add(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
    return out


def test_peer_sigkill_flushes_fast(shm_dir: Path) -> None:
    """SIGKILL of the peer: our QP goes to ERR and a waiting call returns flushed in < 1 s."""
    fds_before, shm_before = _fds(), set(os.listdir("/dev/shm"))
    local = make_side(shm_dir, "local", 9)
    p = start(shm_dir, local)
    local.qp.post_recv(RecvWr(wr_id=77, sg_list=(Sge(local.buf.addr, 64, local.buf.lkey),)))
    # make sure the peer mapped our memory too (it has written into us once)
    local.buf.buf[:4] = b"ping"
    local.qp.post_send(write_wr(local, p, 0, 4, flags=SIG))
    assert local.wait()[0].status is WcStatus.SUCCESS
    pid = p.info["pid"]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    (wc,) = local.wait(timeout=5.0)
    elapsed = time.monotonic() - t0
    assert (wc.wr_id, wc.status) == (77, WcStatus.WR_FLUSH_ERR)
    assert local.qp.state is QpState.ERR
    assert elapsed < 1.0, f"peer death took {elapsed:.3f} s to notice"
    print(f"peer death noticed after {elapsed * 1000:.1f} ms")
    local.qp.post_send(write_wr(local, p, 0, 4, wr_id=8))
    assert [(w.wr_id, w.status) for w in local.wait()] == [(8, WcStatus.WR_FLUSH_ERR)]
    p.close()
    local.dev.close()
    assert _fds() == fds_before
    assert set(os.listdir("/dev/shm")) == shm_before


def test_no_leaks_after_close(shm_dir: Path) -> None:
    """A full session (connect, write, send, close both) leaves no fd and no /dev/shm entry."""
    fds_before, shm_before = _fds(), set(os.listdir("/dev/shm"))
    for _ in range(2):
        local = make_side(shm_dir, "local", 1)
        p = start(shm_dir, local)
        assert p.ask("post_recv", 1) == "ok"
        local.buf.buf[:8] = b"leakfree"
        local.qp.post_send([write_wr(local, p, 0, 8), send_wr(local, 0, 8, 1)])
        wc = local.wait()[0]
        assert wc.status is WcStatus.SUCCESS, f"{wc.status!r}; {_peer_area(local)}"
        assert p.ask("wait", 1, 5.0, 0, 8)[0][4] == b"leakfree"
        assert p.ask("close") == "closed"
        p.proc.join(10)
        assert p.proc.exitcode == 0
        p.close()
        local.dev.close()
    assert _fds() == fds_before
    assert set(os.listdir("/dev/shm")) == shm_before
    assert list(shm_dir.glob("*.sock")) == []


def test_a_peer_republishing_its_attributes_never_shows_them_torn(local: Side,
                                                                   peer: Peer) -> None:
    """While the peer's QP is modified again and again (RTS -> RTS, min_rnr_timer changing),
    this side's reads of the attributes it publishes see each field's old or new value,
    never anything else: a slot size read as 0 failed SENDs LOC_LEN_ERR."""
    assert local.qp._peer is not None
    area = local.qp._peer.area
    before = lay.AREA_FIELDS.unpack_from(area, 0)
    peer.conn.send(("remodify", 0.5))
    reads, torn = 0, set()
    while not peer.conn.poll(0):
        for _ in range(1000):
            fields = lay.AREA_FIELDS.unpack_from(area, 0)
            if fields[:2] != before[:2] or fields[2] not in (5, 7) or fields[3:] != before[3:]:
                torn.add(fields)
        reads += 1000
    modifies = peer.conn.recv()
    assert modifies > 100 and reads > 10_000, (modifies, reads)
    assert not torn, f"{len(torn)} torn headers in {reads} reads, e.g. {sorted(torn)[:3]}"
    assert peer.ask("post_recv", 1) == "ok"
    local.buf.buf[:8] = b"notatorn"
    local.qp.post_send(send_wr(local, 0, 8, 1))
    assert local.wait()[0].status is WcStatus.SUCCESS
    assert peer.ask("wait", 1, 5.0, 0, 8)[0][5] == b"notatorn"  # (the receive buffer)


def _peer_area(local: Side) -> str:
    """The peer's receive area header as this process maps it (for a failure's message)."""
    peer = local.qp._peer
    if peer is None:
        return "no peer mapped"
    return (f"peer area header {lay.AREA_HEADER.unpack_from(peer.area, 0)} "
            f"({len(peer.area)} bytes), depth {peer.depth}, slot size {peer.slot_size}")


def _can_unshare() -> bool:
    if os.geteuid() != 0:
        return False
    probe = CTX.Process(target=enter_new_netns)
    probe.start()
    probe.join(20)
    ok = probe.exitcode == 0
    probe.close()
    return ok


@pytest.mark.root
def test_across_network_namespaces(shm_dir: Path, local: Side) -> None:
    """A peer in another network namespace of this host: WRITE, SEND and READ still work."""
    if not _can_unshare():
        pytest.skip("needs root and unshare(CLONE_NEWNET)")
    p = start(shm_dir, local, netns=True)
    try:
        assert p.info["netns"] != os.readlink("/proc/self/ns/net")
        assert p.ask("post_recv", 1) == "ok"
        local.buf.buf[:8] = b"netns-ok"
        local.qp.post_send([write_wr(local, p, 0, 8), send_wr(local, 0, 8, 1)])
        assert local.wait()[0].status is WcStatus.SUCCESS
        (got,) = p.ask("wait", 1, 5.0, 0, 8)
        assert got[1] == "SUCCESS" and got[4] == b"netns-ok" and got[5] == b"netns-ok"
    finally:
        p.close()


@pytest.mark.slow
def test_data_integrity_stress(local: Side, peer: Peer) -> None:
    """60000 rounds: a 4 KiB WRITE gathered from 2 random-split SGEs, then a SEND naming it.

    Each round of a batch writes its own 4 KiB region of the peer's RMB, so the
    peer's snapshot of that region at the SEND's completion must equal exactly
    what was written (ordering under reuse is the job of
    ``test_write_then_send_ordering``).
    """
    rng = random.Random(7)
    rounds, batch = 60000, 16
    for start in range(0, rounds, batch):
        assert peer.ask("post_recv", batch) == "ok"
        expect = []
        for i in range(start, start + batch):
            region = (i % batch) * 4096
            data = rng.randbytes(4096)
            split = rng.randrange(0, 4097)
            local.buf.buf[0:split] = data[:split]
            local.buf.buf[8192 : 8192 + 4096 - split] = data[split:]
            stamp = 0x8000 + 8 * (i % batch)
            local.buf.buf[stamp : stamp + 8] = i.to_bytes(8, "big")
            sges = (Sge(local.buf.addr, split, local.buf.lkey),
                    Sge(local.buf.addr + 8192, 4096 - split, local.buf.lkey))  # fmt: skip
            local.qp.post_send([
                SendWr(wr_id=i, opcode=WrOpcode.RDMA_WRITE, sg_list=sges,
                       remote_addr=peer.info["addr"] + region, rkey=peer.info["rkey"]),
                send_wr(local, stamp, 8, i),
            ])  # fmt: skip
            assert local.wait()[0].status is WcStatus.SUCCESS
            expect.append(data)
        got = peer.ask("wait_regions", batch, 10.0)
        assert [g[0] for g in got] == list(range(start, start + batch))
        assert [g[4] for g in got] == expect
