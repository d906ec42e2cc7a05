"""Helpers shared by the rdma tests: one side of a connection and how to connect two.

A uniquely named module (not ``conftest``) so that test modules can import it
without colliding with other ``conftest.py`` files on ``sys.path``.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smcr.rdma import AccessFlag, CompletionQueue, MemoryRegion, QpCap, WorkCompletion
from smcr.rdma.shm import ShmDevice, ShmPd, ShmQp

RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ


@dataclass
class Side:
    """One end: device, PD, CQ, QP, a remote-accessible RMB and a local buffer."""

    dev: ShmDevice
    pd: ShmPd
    cq: CompletionQueue
    qp: ShmQp
    rmb: MemoryRegion
    buf: MemoryRegion
    psn: int
    wcs: list[WorkCompletion] = field(default_factory=list)

    def wait(self, n: int = 1, timeout: float = 2.0) -> list[WorkCompletion]:
        """Collect ``n`` completions or fail after ``timeout`` seconds."""
        out: list[WorkCompletion] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out with {out}"
            out += self.cq.wait(left, n - len(out))
        return out


def make_side(directory: Path, name: str, psn: int, rmb_access: AccessFlag = RW,
              cap: QpCap | None = None) -> Side:  # fmt: skip
    """A device with one QP in RESET and its memory."""
    dev = ShmDevice(name, directory=directory)
    pd = dev.alloc_pd()
    cq = dev.create_cq()
    qp = pd.create_qp(cq, cq, cap)
    rmb = pd.alloc_mr(1 << 16, rmb_access)
    buf = pd.alloc_mr(1 << 16, AccessFlag.LOCAL_WRITE)
    return Side(dev, pd, cq, qp, rmb, buf, psn)


def connect(a: Side, b: Side, access: AccessFlag = RW, **options: Any) -> None:
    """Bring both QPs to RTS with each other's GID/QPN/PSN (the CLC exchange)."""
    a.qp.to_rts(dgid=b.dev.gid, dest_qp_num=b.qp.qp_num, rq_psn=b.psn, sq_psn=a.psn,
                access=access, **options)  # fmt: skip
    b.qp.to_rts(dgid=a.dev.gid, dest_qp_num=a.qp.qp_num, rq_psn=a.psn, sq_psn=b.psn,
                access=access, **options)  # fmt: skip


def torn_reads(write: Callable[[mmap.mmap, int], None],
               seen: Callable[[mmap.mmap], object]) -> tuple[list[object], int, int]:  # fmt: skip
    """Words rewritten by another process while this one reads them: ``write(m, 0)`` here,
    then a forked child calls ``write(m, i)`` with ``i`` alternating 1, 0, 1, ... for 0.4 s
    while this process calls ``seen(m)`` for 0.3 s (None for a read that found old or new
    values only, else what it saw).

    :returns: the torn reads, the number of reads, and the child's exit code (0: it wrote
        without an error)."""
    m = mmap.mmap(-1, 4096)
    write(m, 0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            end, i = time.monotonic() + 0.4, 0
            while time.monotonic() < end:
                for _ in range(200):
                    i ^= 1
                    write(m, i)
        except BaseException:
            code = 1
        os._exit(code)
    torn, reads = [], 0
    try:
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            for _ in range(500):
                what = seen(m)
                if what is not None:
                    torn.append(what)
            reads += 500
    finally:
        _, status = os.waitpid(pid, 0)
    return torn, reads, os.waitstatus_to_exitcode(status)
