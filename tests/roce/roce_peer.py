"""A peer process for the RoCEv2 RNIC tests: one device, one QP, driven by JSON lines.

Started inside a network namespace with ``ip netns exec NS python -m
tests.roce.roce_peer ADDRESS``; the test sends one JSON command per line on
stdin and reads one JSON answer per line on stdout, so a test reads as a
dialogue between two hosts.  Bulk data never crosses the pipe: buffers are
filled from a seed and compared by SHA-256.  Every wait inside is bounded.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from typing import Any

from smcr.rdma import AccessFlag, PathMtu, RecvWr, SendFlag, SendWr, Sge, WorkCompletion, WrOpcode
from smcr.rdma.roce import RoceDevice

RW = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE | AccessFlag.REMOTE_READ
SIZE = 16 << 20
RECV_SLOT = 4096


def digest(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def pattern(seed: int, n: int) -> bytes:
    """``n`` pseudo-random bytes from ``seed`` (the same in every process)."""
    return random.Random(seed).randbytes(n)


def summary(w: WorkCompletion) -> list[Any]:
    return [w.wr_id, w.status.name, w.opcode.name, w.byte_len, w.imm_data]


class Peer:
    """One host's end: device, PD, CQ, QP, a remote-accessible RMB and a local buffer."""

    def __init__(self, address: str) -> None:
        self.dev = RoceDevice(address)
        self.pd = self.dev.alloc_pd()
        self.cq = self.dev.create_cq()
        self.qp = self.pd.create_qp(self.cq, self.cq)
        self.rmb = self.pd.alloc_mr(SIZE, RW)
        self.buf = self.pd.alloc_mr(SIZE, AccessFlag.LOCAL_WRITE)
        self.psn = random.randrange(1 << 24)
        self.recv_slot = 0

    def wait(self, n: int, timeout: float) -> list[list[Any]]:
        out: list[list[Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            out += [summary(w) for w in self.cq.wait(left, n - len(out))]
        return out

    def handle(self, cmd: str, a: dict[str, Any]) -> Any:
        qp, buf, rmb = self.qp, self.buf, self.rmb
        if cmd == "info":
            return {"gid": self.dev.gid.hex(), "qpn": qp.qp_num, "psn": self.psn,
                    "rkey": rmb.rkey, "addr": rmb.addr, "mtu": int(self.dev.max_mtu)}
        if cmd == "connect":
            r = a["remote"]
            options = dict(a.get("options", {}))
            if "path_mtu" in options:
                options["path_mtu"] = PathMtu(options["path_mtu"])
            qp.to_rts(dgid=bytes.fromhex(r["gid"]), dest_qp_num=r["qpn"], rq_psn=r["psn"],
                      sq_psn=self.psn, access=RW, **options)
            return "up"
        if cmd == "fill":  # local buffer from a seed
            buf.buf[: a["n"]] = pattern(a["seed"], a["n"])
            return digest(buf.buf[: a["n"]])
        if cmd == "fill_rmb":
            rmb.buf[:] = bytes([a["byte"]]) * SIZE
            return "ok"
        if cmd == "digest":
            return digest(rmb.buf[a["off"] : a["off"] + a["n"]])
        if cmd == "rmb":
            return bytes(rmb.buf[a["off"] : a["off"] + a["n"]]).hex()
        if cmd == "post_recv":
            rwrs: list[RecvWr] = []
            for _ in range(a["count"]):
                off = (self.recv_slot % 64) * RECV_SLOT
                rwrs.append(RecvWr(wr_id=self.recv_slot,
                                  sg_list=(Sge(buf.addr + off, RECV_SLOT, buf.lkey),)))
                self.recv_slot += 1
            qp.post_recv(rwrs)
            return "ok"
        if cmd == "recv_data":  # the bytes a receive WR got
            off = (a["wr_id"] % 64) * RECV_SLOT
            return bytes(buf.buf[off : off + a["n"]]).hex()
        if cmd == "post":
            # a list of WRs: [opcode, local_off, n, remote_off, signaled, imm, rkey or None]
            wrs = []
            for i, (op, loff, n, roff, sig, imm, rkey) in enumerate(a["wrs"]):
                wrs.append(SendWr(
                    wr_id=a.get("base", 0) + i, opcode=WrOpcode[op],
                    send_flags=SendFlag.SIGNALED if sig else SendFlag.NONE,
                    sg_list=(Sge(buf.addr + loff, n, buf.lkey),),
                    remote_addr=a["remote"]["addr"] + roff,
                    rkey=a["remote"]["rkey"] if rkey is None else rkey, imm_data=imm))
            t0 = time.monotonic()
            qp.post_send(wrs)
            got = self.wait(a.get("expect", 0), a.get("timeout", 10.0))
            return {"wcs": got, "elapsed": time.monotonic() - t0}
        if cmd == "buf_digest":
            return digest(buf.buf[a["off"] : a["off"] + a["n"]])
        if cmd == "wait":
            return self.wait(a["n"], a["timeout"])
        if cmd == "state":
            return qp.state.name
        if cmd == "stats":
            return {"dev": self.dev.stats, "req": qp.req.stats, "resp": qp.resp.stats,
                    "sport": qp.sport}
        raise ValueError(cmd)


def main() -> None:
    peer = Peer(sys.argv[1])
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        cmd, args = json.loads(line)
        if cmd == "close":
            peer.dev.close()
            print(json.dumps("closed"), flush=True)
            return
        try:
            answer = peer.handle(cmd, args)
        except Exception as e:  # report to the test instead of dying silently
            answer = {"error": repr(e)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
