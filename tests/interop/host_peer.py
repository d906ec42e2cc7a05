"""Host side of the rxe interop tests: smcr's RNIC in netns ``smcnet``, plus the side channel.

Started with ``ip netns exec smcnet python -m tests.interop.host_peer 10.99.0.1
GUEST_IP PORT``.  It is :class:`tests.roce.roce_peer.Peer` (one RoceDevice on
10.99.0.1, one RC QP, two 16 MiB MRs, the same JSON-line command language) with
two additions:

* ``guest``: relay one command to the guest's pyverbs program
  (``harness/tools/rxe_peer.py``) over the TCP side channel and return its
  answer.  Why a relay: the guest (10.99.0.11) is reachable only from inside
  the namespace, and the test process runs outside it; this process is inside
  anyway, so the test needs only one pipe.
* ``destroy_qp``: destroy our QP without completions (the peer disappears).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any

from smcr.rdma import RecvWr, Sge
from tests.roce.roce_peer import Peer


class InteropPeer(Peer):
    """The smcr end, with a TCP side channel to the guest's QP."""

    def __init__(self, address: str, guest: str, port: int) -> None:
        super().__init__(address)
        self.recv_sizes: dict[int, int] = {}
        self.chan = _connect(guest, port, deadline=time.monotonic() + 60.0)
        self.chan_r = self.chan.makefile("r")
        first = self._read(30.0)
        if first != "ready":
            raise RuntimeError(f"guest peer said {first!r}")

    def _read(self, timeout: float) -> Any:
        self.chan.settimeout(timeout)
        line = self.chan_r.readline()
        if not line:
            raise RuntimeError("the guest closed the side channel")
        return json.loads(line)

    def handle(self, cmd: str, a: dict[str, Any]) -> Any:
        if cmd == "guest":
            args = a.get("args", {})
            self.chan.sendall((json.dumps([a["op"], args]) + "\n").encode())
            return self._read(max(30.0, args.get("timeout", 0.0) + 20.0))
        if cmd == "destroy_qp":
            self.qp.destroy()
            return "ok"
        if cmd == "post_recv" and "size" in a:  # bigger slots for multi-packet SENDs
            return self._post_recv_sized(a["count"], a["size"])
        if cmd == "recv_data" and a["wr_id"] in self.recv_sizes:
            off = (a["wr_id"] % 64) * self.recv_sizes[a["wr_id"]]
            return bytes(self.buf.buf[off : off + a["n"]]).hex()
        return super().handle(cmd, a)

    def _post_recv_sized(self, count: int, size: int) -> str:
        wrs = []
        for _ in range(count):
            off = (self.recv_slot % 64) * size
            self.recv_sizes[self.recv_slot] = size
            wrs.append(RecvWr(wr_id=self.recv_slot,
                              sg_list=(Sge(self.buf.addr + off, size, self.buf.lkey),)))
            self.recv_slot += 1
        self.qp.post_recv(wrs)
        return "ok"

    def close(self) -> None:
        """Close the guest's session (it frees its QP) and our device."""
        try:
            self.chan.sendall(b'["close", {}]\n')
            self._read(10.0)
        except (OSError, RuntimeError, ValueError):
            pass
        self.chan.close()
        self.dev.close()


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """Connect to the guest's server, retrying while it starts (bounded)."""
    while True:
        try:
            return socket.create_connection((host, port), timeout=5.0)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> None:
    peer = InteropPeer(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        cmd, args = json.loads(line)
        if cmd == "close":
            peer.close()
            print(json.dumps("closed"), flush=True)
            return
        try:
            answer = peer.handle(cmd, args)
        except Exception as e:  # report to the test instead of dying silently
            answer = {"error": repr(e)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
