"""A peer process for the shm RNIC tests: one device, one QP, driven over a pipe.

The test process is one end of each RC connection and this helper, started with
the ``spawn`` context, is the other, so every test crosses a real process
boundary.  The child answers small commands so a test reads as a dialogue;
every wait inside it is bounded.
"""

from __future__ import annotations

import ctypes
import os
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from smcr.rdma import (
    AccessFlag,
    QpAttr,
    QpAttrMask,
    QpState,
    RecvWr,
    SendFlag,
    SendWr,
    Sge,
    WorkCompletion,
    WrOpcode,
)
from smcr.rdma.shm import ShmDevice

RMB_SIZE = 1 << 16
CLONE_NEWNET = 0x40000000
RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ


def summarize(wcs: list[WorkCompletion]) -> list[tuple[int, str, int, int]]:
    """Completions as plain tuples (wr_id, status name, byte_len, imm) for the pipe."""
    return [(w.wr_id, w.status.name, w.byte_len, w.imm_data) for w in wcs]


def info_of(dev: ShmDevice, qp_num: int, psn: int, mr_rkey: int, mr_addr: int) -> dict[str, Any]:
    """What SMC-R would send in CLC: GID, QPN, PSN, rkey and address of the RMB."""
    return {"gid": dev.gid, "qpn": qp_num, "psn": psn, "rkey": mr_rkey, "addr": mr_addr}


def enter_new_netns() -> None:
    """Move this process into a fresh network namespace (``unshare(CLONE_NEWNET)``, root only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")


def peer_main(
    conn: Connection, directory: str, qp_access: int, rmb_access: int, netns: bool = False
) -> None:
    """Child entry point: set up, exchange info, then serve commands until ``close``."""
    if netns:
        enter_new_netns()
    dev = ShmDevice("peer", directory=Path(directory))
    pd = dev.alloc_pd()
    cq = dev.create_cq()
    qp = pd.create_qp(cq, cq)
    rmb = pd.alloc_mr(RMB_SIZE, AccessFlag(rmb_access))
    rbuf = pd.alloc_mr(1 << 16, AccessFlag.LOCAL_WRITE)
    conn.send(info_of(dev, qp.qp_num, 4242, rmb.rkey, rmb.addr)
              | {"pid": os.getpid(), "netns": os.readlink("/proc/self/ns/net")})  # fmt: skip
    remote = conn.recv()
    qp.to_rts(dgid=remote["gid"], dest_qp_num=remote["qpn"], rq_psn=remote["psn"], sq_psn=4242,
              access=AccessFlag(qp_access))  # fmt: skip
    conn.send("up")
    recv_slot = 0
    while True:
        cmd, *args = conn.recv()
        if cmd == "close":
            dev.close()
            conn.send("closed")
            return
        if cmd == "post_recv":
            wrs = []
            for _ in range(args[0]):
                sge = Sge(rbuf.addr + 256 * (recv_slot % 256), args[1] if len(args) > 1 else 256,
                          rbuf.lkey)  # fmt: skip
                wrs.append(RecvWr(wr_id=recv_slot, sg_list=(sge,)))
                recv_slot += 1
            qp.post_recv(wrs)
            conn.send("ok")
        elif cmd == "wait":
            # wait for n completions; for receives, also report what the RMB held right then
            n, timeout, rmb_off, rmb_len = args
            out: list[tuple[Any, ...]] = []
            deadline = time.monotonic() + timeout
            while len(out) < n and time.monotonic() < deadline:
                for w in cq.wait(deadline - time.monotonic()):
                    seen = bytes(rmb.buf[rmb_off : rmb_off + rmb_len])
                    data = bytes(rbuf.buf[256 * (w.wr_id % 256) : 256 * (w.wr_id % 256) + 8])
                    out.append((*summarize([w])[0], seen, data))
            conn.send(out)
        elif cmd == "wait_regions":
            # like "wait", but snapshot the 4 KiB region the round's wr_id names
            n, timeout = args
            out = []
            deadline = time.monotonic() + timeout
            while len(out) < n and time.monotonic() < deadline:
                for w in cq.wait(deadline - time.monotonic()):
                    region = (w.wr_id % n) * 4096
                    out.append((*summarize([w])[0], bytes(rmb.buf[region : region + 4096])))
            conn.send(out)
        elif cmd == "rmb":
            conn.send(bytes(rmb.buf[args[0] : args[0] + args[1]]))
        elif cmd == "fill":
            rmb.buf[:] = bytes([args[0]]) * RMB_SIZE
            conn.send("ok")
        elif cmd == "dereg":
            rmb.dereg()
            conn.send("ok")
        elif cmd == "state":
            conn.send(qp.state.name)
        elif cmd == "remodify":
            # RTS -> RTS modifies for the given seconds, min_rnr_timer between two values:
            # each one republishes the QP's attributes where the peer reads them
            timers, end, count = (7, 5), time.monotonic() + args[0], 0
            while time.monotonic() < end:
                count += 1
                qp.modify(QpAttr(qp_state=QpState.RTS, min_rnr_timer=timers[count % 2]),
                          QpAttrMask.STATE | QpAttrMask.MIN_RNR_TIMER)  # fmt: skip
            conn.send(count)
        elif cmd == "send":
            rbuf.buf[:8] = args[0]
            qp.post_send(SendWr(wr_id=99, opcode=WrOpcode.SEND, send_flags=SendFlag.SIGNALED,
                                sg_list=(Sge(rbuf.addr, 8, rbuf.lkey),)))  # fmt: skip
            conn.send("ok")
