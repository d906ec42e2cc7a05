"""Guest side of the rxe interop tests: one RC QP on rxe0 per TCP connection, driven by JSON lines.

Runs *inside* the QEMU guest (Debian 12, python3 + python3-pyverbs), started
once per test session with ``python3 rxe_peer.py PORT``.  Each TCP connection
from the host (the side channel) gets a fresh context, PD, CQ, RC QP and two
16 MiB MRs (``rmb``: remote read/write; ``buf``: local), so every test starts
from a clean QP even after an earlier one ended in ERR.

The command language is the one of ``tests/roce/roce_peer.py`` (the smcr peer),
so the host-side tests drive both ends alike: ``info``, ``connect``, ``fill``,
``fill_rmb``, ``digest``, ``buf_digest``, ``rmb``, ``post_recv``,
``recv_data``, ``post``, ``wait``, ``state``, plus ``destroy_qp`` (the peer
disappears).  Bulk data never crosses the channel: buffers are filled from a
seed (``random.Random(seed).randbytes``, identical on host and guest) and
compared by SHA-256.  Every wait is bounded.

Why not pyverbs' ``to_rts``: the modifies are spelled out with their masks, so
the attributes on the wire (hop limit, timeout, retry counts) are the ones the
test asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pyverbs.enums as e  # type: ignore[import-not-found]
from pyverbs.addr import GID, AHAttr, GlobalRoute  # type: ignore[import-not-found]
from pyverbs.cq import CQ  # type: ignore[import-not-found]
from pyverbs.device import Context  # type: ignore[import-not-found]
from pyverbs.mr import MR  # type: ignore[import-not-found]
from pyverbs.pd import PD  # type: ignore[import-not-found]
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr  # type: ignore[import-not-found]
from pyverbs.wr import SGE, RecvWR, SendWR  # type: ignore[import-not-found]

DEVICE = "rxe0"
SIZE = 16 << 20
RECV_SLOT = 4096
RW = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
WR_OPCODES = {
    "RDMA_WRITE": e.IBV_WR_RDMA_WRITE, "RDMA_WRITE_WITH_IMM": e.IBV_WR_RDMA_WRITE_WITH_IMM,
    "SEND": e.IBV_WR_SEND, "SEND_WITH_IMM": e.IBV_WR_SEND_WITH_IMM,
    "RDMA_READ": e.IBV_WR_RDMA_READ,
}
WC_OPCODES = {0: "SEND", 1: "RDMA_WRITE", 2: "RDMA_READ", 128: "RECV", 129: "RECV_RDMA_WITH_IMM"}
WC_STATUS = ["SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
             "WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR",
             "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR"]
QP_STATES = ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"]
IBV_WC_WITH_IMM = 2


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pattern(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def gid_words(raw_hex: str) -> str:
    """pyverbs' GID spelling (eight 4-digit words) of 32 hex digits."""
    return ":".join(raw_hex[i : i + 4] for i in range(0, 32, 4))


def ipv4_gid_index(address: str) -> int:
    """The rxe0 port-1 GID table index of ``::ffff:address`` (rxe puts it after fe80::)."""
    want = "0000:0000:0000:0000:0000:ffff:" + "".join(
        f"{int(b):02x}" for b in address.split(".")
    )
    want = want[:-4] + ":" + want[-4:]
    gids = Path(f"/sys/class/infiniband/{DEVICE}/ports/1/gids")
    for i in range(16):
        try:
            if (gids / str(i)).read_text().strip() == want:
                return i
        except OSError:
            continue
    raise LookupError(f"no GID {want} on {DEVICE}")


def local_ipv4() -> str:
    """eth0's IPv4 address (the guest agent set it from the kernel command line)."""
    cmdline = Path("/proc/cmdline").read_text()
    for word in cmdline.split():
        if word.startswith("guestip="):
            return word.split("=", 1)[1].split("/", 1)[0]
    raise LookupError("no guestip= on the kernel command line")


class Peer:
    """One connection's RC QP with its memory (see the module docstring)."""

    def __init__(self) -> None:
        self.ctx = Context(name=DEVICE)
        self.address = local_ipv4()
        self.gid_index = ipv4_gid_index(self.address)
        self.gid = self.ctx.query_gid(1, self.gid_index).gid.replace(":", "")
        port = self.ctx.query_port(1)
        self.mtu = int(port.active_mtu)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 4096)
        cap = QPCap(max_send_wr=512, max_recv_wr=512, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                         cap=cap, sq_sig_all=0))
        self.rmb = MR(self.pd, SIZE, RW)
        self.buf = MR(self.pd, SIZE, e.IBV_ACCESS_LOCAL_WRITE)
        self.psn = random.randrange(1 << 24)
        self.recv_slot = 0
        self.recv_size: dict[int, int] = {}

    def poll(self, n: int, timeout: float) -> list[list[Any]]:
        out: list[list[Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < n and time.monotonic() < deadline:
            got, wcs = self.cq.poll(n - len(out))
            if not got:
                time.sleep(0.001)
                continue
            for wc in wcs:
                imm = socket.ntohl(wc.imm_data) if wc.wc_flags & IBV_WC_WITH_IMM else 0
                status = WC_STATUS[wc.status] if wc.status < len(WC_STATUS) else str(wc.status)
                out.append([wc.wr_id, status, WC_OPCODES.get(wc.opcode, str(wc.opcode)),
                            wc.byte_len, imm])
        return out

    def connect(self, r: dict[str, Any], o: dict[str, Any]) -> str:
        qp = self.qp
        a = QPAttr(qp_state=e.IBV_QPS_INIT, cur_qp_state=e.IBV_QPS_RESET)
        a.qp_access_flags = RW
        a.pkey_index = 0
        a.port_num = 1
        qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                  | e.IBV_QP_ACCESS_FLAGS)
        a = QPAttr(qp_state=e.IBV_QPS_RTR)
        gr = GlobalRoute(dgid=GID(gid_words(r["gid"])), sgid_index=self.gid_index,
                         hop_limit=o.get("hop_limit", 1))
        a.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
        a.path_mtu = o.get("path_mtu", self.mtu)
        a.dest_qp_num = r["qpn"]
        a.rq_psn = r["psn"]
        a.max_dest_rd_atomic = o.get("max_rd_atomic", 1)
        a.min_rnr_timer = o.get("min_rnr_timer", 5)
        qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                  | e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        a = QPAttr(qp_state=e.IBV_QPS_RTS)
        a.timeout = o.get("timeout", 15)
        a.retry_cnt = o.get("retry_cnt", 7)
        a.rnr_retry = o.get("rnr_retry", 7)
        a.sq_psn = self.psn
        a.max_rd_atomic = o.get("max_rd_atomic", 1)
        qp.modify(a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                  | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
        return "up"

    def handle(self, cmd: str, a: dict[str, Any]) -> Any:
        qp, buf, rmb = self.qp, self.buf, self.rmb
        if cmd == "info":
            return {"gid": self.gid, "qpn": qp.qp_num, "psn": self.psn, "rkey": rmb.rkey,
                    "addr": rmb.buf, "mtu": self.mtu, "size": SIZE}
        if cmd == "connect":
            return self.connect(a["remote"], dict(a.get("options", {})))
        if cmd == "fill":
            data = pattern(a["seed"], a["n"])
            buf.write(data, len(data), 0)
            return digest(data)
        if cmd == "fill_rmb":
            chunk = bytes([a["byte"]]) * (1 << 20)
            for off in range(0, SIZE, len(chunk)):
                rmb.write(chunk, len(chunk), off)
            return "ok"
        if cmd == "digest":
            return digest(rmb.read(a["n"], a["off"]))
        if cmd == "buf_digest":
            return digest(buf.read(a["n"], a["off"]))
        if cmd == "rmb":
            return bytes(rmb.read(a["n"], a["off"])).hex()
        if cmd == "post_recv":
            size = a.get("size", RECV_SLOT)
            for _ in range(a["count"]):
                off = (self.recv_slot % 64) * size
                self.recv_size[self.recv_slot] = size
                qp.post_recv(RecvWR(wr_id=self.recv_slot, num_sge=1,
                                    sg=[SGE(buf.buf + off, size, buf.lkey)]))
                self.recv_slot += 1
            return "ok"
        if cmd == "recv_data":
            off = (a["wr_id"] % 64) * self.recv_size.get(a["wr_id"], RECV_SLOT)
            return bytes(buf.read(a["n"], off)).hex()
        if cmd == "post":
            t0 = time.monotonic()
            for i, (op, loff, n, roff, sig, imm, rkey) in enumerate(a["wrs"]):
                wr = SendWR(wr_id=a.get("base", 0) + i, opcode=WR_OPCODES[op], num_sge=1,
                            sg=[SGE(buf.buf + loff, n, buf.lkey)],
                            send_flags=e.IBV_SEND_SIGNALED if sig else 0,
                            imm_data=socket.htonl(imm))
                wr.set_wr_rdma(a["remote"]["rkey"] if rkey is None else rkey,
                               a["remote"]["addr"] + roff)
                qp.post_send(wr)
            got = self.poll(a.get("expect", 0), a.get("timeout", 10.0))
            return {"wcs": got, "elapsed": time.monotonic() - t0}
        if cmd == "wait":
            return self.poll(a["n"], a["timeout"])
        if cmd == "state":
            return QP_STATES[qp.query(e.IBV_QP_STATE)[0].qp_state]
        if cmd == "destroy_qp":
            qp.close()
            return "ok"
        raise ValueError(cmd)

    def close(self) -> None:
        for obj in (self.qp, self.rmb, self.buf, self.cq, self.pd, self.ctx):
            with contextlib.suppress(Exception):  # closed (destroy_qp) or in error: go on
                obj.close()


def serve(conn: socket.socket) -> None:
    """One side-channel connection: a fresh QP, commands until EOF or ``close``."""
    peer = Peer()
    rfile = conn.makefile("r")
    try:
        conn.sendall(b'"ready"\n')
        for line in rfile:
            cmd, args = json.loads(line)
            if cmd == "close":
                conn.sendall(b'"closed"\n')
                return
            try:
                answer = peer.handle(cmd, args)
            except Exception as exc:  # report to the host instead of dying silently
                answer = {"error": repr(exc), "trace": traceback.format_exc()}
            conn.sendall((json.dumps(answer) + "\n").encode())
    finally:
        peer.close()
        rfile.close()
        conn.close()


def serve_logged(conn: socket.socket) -> None:
    try:
        serve(conn)
    except Exception:  # a broken channel ends that session, not the server
        traceback.print_exc()
        sys.stdout.flush()


def main() -> None:
    """Serve each side channel in a thread of its own: a session still inside a long
    command when its host end gave up (a test that timed out under TCG) must not keep
    the next test's session from starting (each has its own context and QP); served one
    after another, one slow command failed every later test of the run."""
    port = int(sys.argv[1])
    srv = socket.create_server(("0.0.0.0", port), reuse_port=False)
    print(f"listening on {port}", flush=True)
    while True:
        conn, addr = srv.accept()
        print(f"connection from {addr}", flush=True)
        threading.Thread(target=serve_logged, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
