"""``smcr trace``, the traced process's side: what its SMC-R connections do, while a tool listens.

Design (the why of each):

* **Nothing on the data path unless tracing.**  The hooks are taps, the
  explicit hook points of the runtime's objects, each an attribute that is
  None unless something watches (all that the data path tests): a QP's
  (:class:`~smcr.rdma.base.QpTap`, :meth:`~smcr.rdma.base.QueuePair.set_tap`)
  sees its ``post_send`` and ``post_writes_send`` (every LLC and CDC SEND and
  every RDMA WRITE posted, fused or not, each once), the runtime's
  (:class:`~smcr.stack.hostconn.StackTap`, ``Stack.tap``) every SEND that
  arrived, CLC sent and received on the TCP socket, and the QPs made while
  tracing (which get a tap too).  (Why taps and not methods shadowed per
  instance: those classes are native ones in the compiled build,
  :mod:`smcr.nativebuild`, whose compiled callers would never see a shadow.)
  They are set when a tool asks (:func:`open_stream`) and taken away when it
  goes; without a trace the runtime runs as if there were none.
* **A trace cannot hurt the process.**  A hook appends a small tuple to a
  bounded deque (:data:`MAX_RECORDS`); when the tool reads too slowly the
  record is dropped and counted, never waited for.  Turning records into JSON
  is the diag endpoint's thread's work (:meth:`TraceStream.next_frame`), out of
  the data path.  One trace at a time per process.
* **Records, not frames.**  The process tells what happened with the
  identifiers it knows (link: GIDs, MACs, QPNs, initial PSNs, path MTU;
  connection: TCP addresses, RMB); the tool frames it for Wireshark
  (:mod:`smcr.tools.tracepcap`).  A received RDMA WRITE leaves no trace in the
  receiver (over shm the peer copies into our memory; over RoCE it completes
  nothing), so the tool infers it from the producer cursor of the CDC that
  announces it; for that the first CDC of each connection comes with the
  connection's RMB and producer cursor (a ``"conn"`` record).

Record kinds (JSON objects in the stream's frames; ``t`` the kind, ``ts`` UNIX time):
``link`` (``dev, qpn, gid, mac, peer_gid, peer_mac, peer_qpn, psn, peer_psn, mtu,
exact``), ``clc`` (``dev, conn, out, local, peer, data``), ``send`` (``dev, qpn,
out, data``), ``write`` (``dev, qpn, va, rkey, len, data``: posted by us),
``conn`` (``dev, qpn, token, rkey, vaddr, size, prod``); bytes as base64.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from smcr.rdma.base import QpTap, QueuePair
from smcr.rdma.verbs import SendFlag, SendWr, WrOpcode
from smcr.stack import runtime
from smcr.stack.hostconn import StackTap

MAX_RECORDS = 8192
"""Records held for the tool; past this, new ones are dropped (and counted)."""
MAX_SNAP = 4096
"""Most payload bytes of an RDMA WRITE a trace keeps (a tool asks for 0 .. this)."""
FRAME_RECORDS = 2048
"""Most records in one frame of the stream."""
FRAME_BYTES = 1 << 20
"""Payload bytes after which a frame is closed (a frame stays far below MAX_ANSWER)."""

_SEND, _WRITE, _INLINE = WrOpcode.SEND, WrOpcode.RDMA_WRITE, SendFlag.INLINE
_CDC = 0xFE

_active_lock = threading.Lock()
_active: list[Tracer] = []  # at most one


class TraceBusyError(Exception):
    """This process is traced already."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Tracer:
    """The hooks on this process's runtimes and the records they leave (module docstring)."""

    def __init__(self, snap: int) -> None:
        self.snap = max(0, min(int(snap), MAX_SNAP))
        self.pid = os.getpid()  # a forked child has its own runtimes and its own trace
        self.records: deque[tuple[Any, ...]] = deque()
        self.recorded = 0
        self.dropped = 0
        self.stacks: list[Any] = []
        self._described: set[tuple[int, int]] = set()  # (dev, qpn) whose link was told
        self._conns_told: set[tuple[int, int]] = set()  # (dev, token) whose RMB was told
        self._clc_addr: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._fresh: set[tuple[int, int]] = set()  # (dev, qpn) of QPs made while tracing
        self._running = False
        self._lock = threading.Lock()  # hooking and unhooking (never the data path)

    # ------------------------------------------------------------ install

    def start(self, stacks: list[Any] | None = None) -> None:
        """Hook every runtime of this process, and those made from now on (or only
        ``stacks``: the tests' runtimes side by side)."""
        self._running = True
        if stacks is not None:
            for stack in stacks:
                self._hook_stack(stack)
            return
        runtime.on_new_stack.append(self._hook_stack)
        for stack in runtime.process_stacks():
            self._hook_stack(stack)

    def stop(self) -> None:
        """Take every hook away (idempotent); the records stay for the tool."""
        with self._lock:
            self._unhook()

    def _unhook(self) -> None:
        if not self._running:
            return
        self._running = False
        with contextlib.suppress(ValueError):
            runtime.on_new_stack.remove(self._hook_stack)
        for stack in self.stacks:
            tap = stack.tap
            if isinstance(tap, _StackTrace) and tap.tracer is self:
                stack.tap = None
            for qp in _members(stack.qps):
                qtap = qp.tap
                if isinstance(qtap, _QpTrace) and qtap.tracer is self:
                    qp.set_tap(None)

    def _hook_stack(self, stack: Any) -> None:
        with self._lock:  # (a runtime made while the tool goes must not keep hooks)
            if (self._running and self.pid == os.getpid()
                    and not any(s is stack for s in self.stacks)):  # fmt: skip
                self._hook_new_stack(stack)

    def _hook_new_stack(self, stack: Any) -> None:
        dev = len(self.stacks)
        self.stacks.append(stack)
        self._hook_runtime(dev, stack)  # new QPs are hooked from here on
        locked = stack.lock.acquire(timeout=1.0)  # (a stuck runtime must not stall the endpoint)
        try:
            for qp in _members(stack.qps):
                self._hook_qp(dev, stack, qp)
        finally:
            if locked:
                stack.lock.release()

    # ------------------------------------------------------------ records

    def _add(self, record: tuple[Any, ...]) -> None:
        if len(self.records) < MAX_RECORDS:
            self.records.append(record)
            self.recorded += 1
        else:
            self.dropped += 1

    def _describe(self, dev: int, stack: Any, qpn: int, qp: Any = None) -> None:
        """Tell the link of ``qpn`` once, before its first record.

        PSNs: a link that came up while tracing starts at its initial PSNs (every
        packet since is recorded: ``exact``); one up before continues from the RNIC's
        next PSNs (:meth:`~smcr.rdma.base.QueuePair.next_psns`), which are the next
        packets' on the send side, and past what arrived already on the receive side.
        """
        link = stack.engine.links.get(qpn)
        if link is None or not link.peer_qpn:
            return
        self._described.add((dev, qpn))
        psn, peer_psn, exact = link.psn, link.peer_psn, (dev, qpn) in self._fresh
        qp = qp if qp is not None else stack.qps.get(qpn)
        now = qp.next_psns() if qp is not None and not exact else None
        if now is not None:  # a link up before the trace: the RNIC's PSNs as they are now
            psn, peer_psn = now
        self._add(("link", time.time(), dev, qpn, stack.device.gid, stack.device.mac,
                   link.peer_gid, link.peer_mac, link.peer_qpn, psn, peer_psn,
                   link.mtu, exact))  # fmt: skip

    def _hook_runtime(self, dev: int, stack: Any) -> None:
        stack.tap = _StackTrace(self, dev)

    def _tell_conn(self, dev: int, stack: Any, qpn: int, token: int) -> None:
        """The RMB and producer cursor of the connection a CDC is for, before that CDC."""
        link = stack.engine.links.get(qpn)
        c = link.lgr.conns.get(token) if link is not None else None
        if c is None:
            return
        self._conns_told.add((dev, token))
        self._add(("conn", time.time(), dev, qpn, token, c.rmb.rkey, c.rmb.vaddr, c.rmb.size,
                   c.rx_prod))  # fmt: skip

    def _clc(self, dev: int, stack: Any, conn: int, out: bool, data: bytes) -> None:
        key = (dev, conn)
        addr = self._clc_addr.get(key)
        if addr is None:
            hc = stack.conns.get(conn)
            addr = (("0.0.0.0", 0), ("0.0.0.0", 0))  # (not an IP socket: tests' socketpairs)
            with contextlib.suppress(AttributeError, OSError):
                local, peer = hc.tcp.getsockname(), hc.tcp.getpeername()
                if isinstance(local, tuple) and isinstance(peer, tuple):
                    addr = (local[:2], peer[:2])
            self._clc_addr[key] = addr
        self._add(("clc", time.time(), dev, conn, out, addr[0], addr[1], data))

    def _hook_qp(self, dev: int, stack: Any, qp: Any) -> None:
        tap = qp.tap
        if isinstance(tap, _QpTrace) and tap.tracer is self:
            return  # hooked already (made while the others were being hooked)
        qp.set_tap(_QpTrace(self, dev, stack, qp))

    # ------------------------------------------------------------ for the endpoint

    def take(self, most: int = FRAME_RECORDS) -> list[dict[str, Any]]:
        """Up to ``most`` records as JSON objects, oldest first (the endpoint's thread)."""
        out: list[dict[str, Any]] = []
        records = self.records
        size = 0
        while records and len(out) < most and size < FRAME_BYTES:
            record = records.popleft()
            size += len(record[-1]) if isinstance(record[-1], bytes) else 0
            out.append(_as_json(record))
        return out


class _StackTrace(StackTap):
    """A traced runtime's tap: its SENDs in, CLC both ways, QPs made while tracing."""

    def __init__(self, tracer: Tracer, dev: int) -> None:
        self.tracer = tracer
        self.dev = dev

    def new_qp(self, stack: Any, qpn: int) -> None:
        tracer = self.tracer
        tracer._fresh.add((self.dev, qpn))
        qp = stack.qps.get(qpn)
        if qp is not None:
            tracer._hook_qp(self.dev, stack, qp)

    def received(self, stack: Any, qpn: int, messages: list[memoryview]) -> None:
        tracer, dev = self.tracer, self.dev
        if (dev, qpn) not in tracer._described:
            tracer._describe(dev, stack, qpn)
        ts = time.time()
        add = tracer._add
        for m in messages:
            if len(m) >= 44 and m[0] == _CDC:
                token = int.from_bytes(m[4:8], "big")
                if (dev, token) not in tracer._conns_told:
                    tracer._tell_conn(dev, stack, qpn, token)
            add(("send", ts, dev, qpn, False, bytes(m)))

    def control(self, stack: Any, action: Any) -> None:
        data = getattr(action, "data", None)
        if type(action).__name__ == "SendClc" and data is not None:
            self.tracer._clc(self.dev, stack, action.conn, True, bytes(data))

    def receive_clc(self, stack: Any, conn: int, data: bytes) -> None:
        self.tracer._clc(self.dev, stack, conn, False, bytes(data))


class _QpTrace(QpTap):
    """A traced QP's tap: every SEND and RDMA WRITE it posts (fused or not), once."""

    def __init__(self, tracer: Tracer, dev: int, stack: Any, qp: Any) -> None:
        self.tracer = tracer
        self.dev = dev
        self.stack = stack
        self.qpn = qp.qp_num
        self.lookup = qp.pd.lookup_local

    def posting(self, qp: QueuePair) -> None:
        if (self.dev, self.qpn) not in self.tracer._described:
            self.tracer._describe(self.dev, self.stack, self.qpn, qp)

    def _payload(self, wr: SendWr, limit: int) -> tuple[int, bytes]:
        if wr.send_flags & _INLINE and wr.inline_data is not None:
            data = wr.inline_data
            return len(data), bytes(data[:limit])
        length = sum(s.length for s in wr.sg_list)
        if not wr.sg_list or limit <= 0:
            return length, b""
        view = self.lookup(wr.sg_list[0], 0)
        return length, bytes(view[:limit]) if view is not None else b""

    def sent(self, qp: QueuePair, wrs: list[SendWr]) -> None:
        ts, dev, qpn = time.time(), self.dev, self.qpn
        add, snap = self.tracer._add, self.tracer.snap
        for wr in wrs:
            if wr.opcode is _WRITE:
                length, data = self._payload(wr, snap)
                add(("write", ts, dev, qpn, wr.remote_addr, wr.rkey, length, data))
            elif wr.opcode is _SEND:
                add(("send", ts, dev, qpn, True, self._payload(wr, 64)[1]))

    def writes_sent(self, qp: QueuePair, writes: Sequence[tuple[int, int, memoryview]],
                    message: bytes) -> None:  # fmt: skip
        ts, dev, qpn = time.time(), self.dev, self.qpn
        add, snap = self.tracer._add, self.tracer.snap
        for addr, rkey, data in writes:
            add(("write", ts, dev, qpn, addr, rkey, len(data), bytes(data[:snap])))
        add(("send", ts, dev, qpn, True, bytes(message)))


def _members(table: dict[int, Any]) -> list[Any]:
    """The values of a dict another thread may change meanwhile."""
    for _ in range(10):
        with contextlib.suppress(RuntimeError):
            return list(table.values())
    return []


def _as_json(r: tuple[Any, ...]) -> dict[str, Any]:
    kind, ts = r[0], r[1]
    if kind == "send":
        return {"t": "send", "ts": ts, "dev": r[2], "qpn": r[3], "out": r[4], "data": _b64(r[5])}
    if kind == "write":
        return {"t": "write", "ts": ts, "dev": r[2], "qpn": r[3], "va": r[4], "rkey": r[5],
                "len": r[6], "data": _b64(r[7])}  # fmt: skip
    if kind == "clc":
        return {"t": "clc", "ts": ts, "dev": r[2], "conn": r[3], "out": r[4],
                "local": list(r[5]), "peer": list(r[6]), "data": _b64(r[7])}  # fmt: skip
    if kind == "link":
        return {"t": "link", "ts": ts, "dev": r[2], "qpn": r[3], "gid": r[4].hex(),
                "mac": r[5].hex(), "peer_gid": r[6].hex(), "peer_mac": r[7].hex(),
                "peer_qpn": r[8], "psn": r[9], "peer_psn": r[10], "mtu": r[11],
                "exact": r[12]}  # fmt: skip
    return {"t": "conn", "ts": ts, "dev": r[2], "qpn": r[3], "token": r[4], "rkey": r[5],
            "vaddr": r[6], "size": r[7], "prod": r[8]}  # fmt: skip


class TraceStream:
    """What the endpoint streams to one tool: frames of records, then a last frame.

    The endpoint's thread calls :meth:`next_frame` when the tool can take more,
    :meth:`stop` when the tool has said it is done (its end of the socket shut),
    and :meth:`close` when the client goes, whatever the reason.
    """

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.ended = False

    def next_frame(self) -> dict[str, Any] | None:
        """The next frame to send, or None when there is nothing (or nothing more)."""
        if self.ended:
            return None
        records = self.tracer.take()
        if records:
            return {"records": records, "dropped": self.tracer.dropped}
        if not self.tracer._running:  # stopped and drained: the last frame
            self.ended = True
            return {"end": True, "recorded": self.tracer.recorded, "dropped": self.tracer.dropped}
        return None

    def stop(self) -> None:
        """The tool is done: hooks off; what is recorded still goes out, then the last frame."""
        self.tracer.stop()

    def close(self) -> None:
        """The client is gone: hooks off, records dropped, another trace may start."""
        self.tracer.stop()
        self.tracer.records.clear()
        with _active_lock:
            if self.tracer in _active:
                _active.remove(self.tracer)


def open_stream(request: dict[str, Any]) -> tuple[dict[str, Any], TraceStream]:
    """Start tracing for a tool's ``{"op": "trace", "snap": N}``.

    :raises TraceBusyError: this process is traced already.
    :raises ValueError: a bad ``snap``.
    """
    snap = request.get("snap", 0)
    if not isinstance(snap, int) or isinstance(snap, bool) or not 0 <= snap <= MAX_SNAP:
        raise ValueError(f"snap must be an integer 0..{MAX_SNAP}")
    with _active_lock:
        _active[:] = [t for t in _active if t.pid == os.getpid()]  # a parent's, in a child
        if _active:
            raise TraceBusyError("this process is being traced already (one trace at a time)")
        tracer = Tracer(snap)
        _active.append(tracer)
    try:
        tracer.start()
    except Exception:
        tracer.stop()
        with _active_lock:
            _active.remove(tracer)
        raise
    from smcr.diag.snapshot import process_info  # noqa: PLC0415

    return {"process": process_info(), "snap": tracer.snap, "host": socket.gethostname()}, \
        TraceStream(tracer)


Opener = Callable[[dict[str, Any]], tuple[dict[str, Any], TraceStream]]
