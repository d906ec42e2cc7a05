"""The shm RNIC: a software RDMA device for processes on one host.

Design decisions (the why of each):

* **Two threads per device.**  A *server* thread answers the rendezvous
  socket (QP hellos at RTR, MR look-ups) and never takes a QP lock; an
  *engine* thread runs timers and watches connections, and may.  A caller
  blocked on a peer's server (connecting, looking up an rkey) can therefore
  never wait, through a chain of locks, on itself.
* **Remote-accessible MRs are provider memory** (:meth:`ShmPd.alloc_mr`): each
  is a memfd the peer maps on first use, so an RDMA WRITE lands with one copy.
  Their entries in the device's shared MR table are what every access is
  checked against; :meth:`ShmPd.reg_mr` registers a caller's buffer for local
  use only (SGE sources and receive buffers), since a Python buffer cannot be
  shared with another process.
* **MR keys** come from :class:`~smcr.rdma.base.KeyAllocator` (``secrets``, never
  a live key twice); a deregistration zeroes the table's seal word first, which
  revokes access for every peer at once, then frees the segment.
* **A READ-only region is mapped read-only by peers**: the look-up hands out a
  descriptor reopened ``O_RDONLY`` through ``/proc/self/fd``, so the kernel, not
  only our checks, refuses writes to it.
* **Addresses**: each MR gets a page-aligned virtual address in a device-wide
  range, with a guard gap, so SGE/RETH addresses behave as verbs' iova do.
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from mmap import mmap
from pathlib import Path
from typing import cast

from smcr import plainsock
from smcr.bound import monotonic
from smcr.rdma.base import (
    PAGE,
    Device,
    KeyAllocator,
    MemoryRegion,
    ProtectionDomain,
    random_qpn,
    zeroed_memory,
)
from smcr.rdma.completion import CompletionQueue
from smcr.rdma.eventloop import Engine
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm import rendezvous as rdv
from smcr.rdma.shm.cq import ShmCompletionQueue
from smcr.rdma.shm.mapping import map_shared
from smcr.rdma.shm.qp import ShmQp
from smcr.rdma.shm.segment import Segment
from smcr.rdma.stores import store, store_u32
from smcr.rdma.verbs import (
    GID_LEN,
    REMOTE_ACCESS,
    AccessFlag,
    DeviceAttr,
    PathMtu,
    QpCap,
    VerbsError,
)

DEFAULT_SLOT_SIZE = 8192
DEFAULT_MAX_MR = 1 << 16
"""Entries of the shared MR table: remote-accessible MRs (RMBs) at once, as the RoCE RNIC
allows.  32 bytes each, in a segment whose pages are backed only once written, so a
large table costs what it holds; below this a process's descriptors run out first."""
IOVA_BASE = 0x0000_7E00_0000_0000
MOST_ASKERS = 256
"""Look-up connections a device keeps for their requesters' next look-ups (past it, each
is closed after its answer, as a requester that keeps none is answered)."""
FIRST_WAIT = 1.0
"""Seconds a new rendezvous connection has to send its first message (a requester sends it
right after its connect)."""
MOST_WAITING = 64
"""New rendezvous connections waited for at once (each holds a descriptor)."""
MAX_INLINE = 1 << 24
"""Inline WRs up to 16 MiB: the requester copies at post time anyway (:mod:`smcr.rdma.shm.qp`),
so an inline WRITE costs what a registered one does and saves the caller a staging copy."""


@dataclass(frozen=True, slots=True)
class Published:
    """A remote-accessible MR as the device publishes it: its MR table entry, where it
    lives (``offset`` in ``segment``), our mapping of it and its seal."""

    index: int
    segment: Segment
    offset: int
    mm: mmap
    mr: MemoryRegion
    seal: int


class ShmDevice(Device):
    """A same-host software RNIC (see the module docstring).

    :param name: device name.
    :param netdev: the net device it serves (for the pnet table above), if any.
    :param directory: rendezvous directory; default :func:`~rendezvous.default_directory`.
    :param slot_size: largest SEND payload (one slot per posted receive).
    :param max_mr: entries of the shared MR table (remote-accessible MRs).
    """

    def __init__(
        self,
        name: str = "shm0",
        *,
        netdev: str | None = None,
        directory: Path | None = None,
        slot_size: int = DEFAULT_SLOT_SIZE,
        max_mr: int = DEFAULT_MAX_MR,
    ) -> None:
        gid = rdv.new_gid()
        attr = DeviceAttr(
            max_qp_wr=4096, max_sge=2, max_cqe=1 << 20, max_mr=max_mr, max_mr_size=1 << 40,
            max_msg_sz=slot_size, max_qp_rd_atom=16, active_mtu=PathMtu.MTU_4096,
            max_inline_data=MAX_INLINE,
        )  # fmt: skip
        super().__init__(name, gid, b"\x02" + gid[11:], netdev, attr)
        self.slot_size = slot_size
        self.directory = rdv.ensure_private_directory(directory or rdv.default_directory())
        rdv.remove_stale(self.directory)
        self.path = rdv.socket_path(self.directory, gid)
        self.table_fd, self._table = lay.new_segment("smcr-mrtable", lay.table_size(max_mr))
        self._free = list(range(max_mr - 1, -1, -1))
        self._gens = [0] * max_mr
        self._remote: dict[int, Published] = {}
        self._granted: dict[bytes, ShmQp] = {}  # a requester's token -> the QP it says hello to
        self._token_of: dict[int, bytes] = {}  # QPN -> the token of its inbound connection
        self.keys = KeyAllocator()
        self._qps: dict[int, ShmQp] = {}
        self._next_iova = IOVA_BASE + secrets.randbits(24) * PAGE
        self.engine = Engine("smcr-shm-engine")  # (the kernel keeps 15 bytes of a name)
        self._listener = rdv.listen(self.path)
        try:
            self._abstract = rdv.listen_abstract(gid)
        except BaseException:
            self._listener.close()
            os.unlink(self.path)
            raise
        self._askers: dict[int, socket.socket] = {}  # kept look-up connections, by descriptor
        self._waiting: dict[int, socket.socket] = {}  # new connections not heard yet (oldest first)
        self._server = Engine("smcr-shm-server")
        self._server.watch(self._listener.fileno(), self._on_accept)
        self._server.watch(self._abstract.fileno(), self._on_accept_abstract)
        self._closed = False

    # --------------------------------------------------------------- objects

    def alloc_pd(self) -> ShmPd:
        """A new protection domain (bookkeeping in :meth:`Device.alloc_pd`)."""
        return cast(ShmPd, super().alloc_pd())

    def _new_pd(self, pd_id: int) -> ShmPd:
        return ShmPd(self, pd_id)

    def _new_cq(self, depth: int) -> CompletionQueue:
        """A CQ that publishes its arming word to the processes sending to it."""
        return ShmCompletionQueue(depth)

    def new_qp(self, pd: ShmPd, send_cq: CompletionQueue, recv_cq: CompletionQueue,
               cap: QpCap, sq_sig_all: bool) -> ShmQp:  # fmt: skip
        """Create a QP with a fresh random 24-bit QPN (0 and 1 are reserved in IB)."""
        with self._lock:
            qpn = random_qpn(self._qps)
            qp = ShmQp(self, pd, qpn, send_cq=send_cq, recv_cq=recv_cq, cap=cap,
                       sq_sig_all=sq_sig_all)  # fmt: skip
            self._qps[qpn] = qp
        return qp

    def forget_qp(self, qpn: int) -> None:
        """Drop a destroyed QP from the rendezvous table."""
        with self._lock:
            self._qps.pop(qpn, None)
            self._granted.pop(self._token_of.pop(qpn, b""), None)

    def publish_mr(self, mr: MemoryRegion, segment: Segment, offset: int, mm: mmap) -> None:
        """Enter a remote-accessible MR in the shared table (the seal word last); it lives
        at ``offset`` in ``segment`` (mapped here as ``mm``), which stays open for it."""
        with self._lock:
            if not self._free:
                raise VerbsError(errno.ENOMEM, "MR table full")
            index = self._free.pop()
            self._gens[index] = gen = (self._gens[index] + 1) & 0xFFFFFFFF
            off = lay.table_offset(index)
            store(self._table, off, lay.MR_ENTRY, 0, gen, int(mr.access) | lay.MR_VALID,
                  mr.pd.pd_id, mr.length, mr.addr)  # fmt: skip
            seal = secrets.randbits(32) | 1
            store_u32(self._table, off, seal)
            segment.hold()
            self._remote[mr.rkey] = Published(index, segment, offset, mm, mr, seal)

    def revoke_mr(self, mr: MemoryRegion) -> None:
        """Deregister: zero the table entry's seal (access ends now), then let the MR's
        range of its segment go."""
        with self._lock:
            entry = self._remote.pop(mr.rkey, None)
            if entry is None:
                return
            off = lay.table_offset(entry.index)
            store_u32(self._table, off, 0)  # revokes: every access checks this word
            store_u32(self._table, off + 8, 0)
            self._free.append(entry.index)
        try:  # a caller still holds a slice: the GC unmaps
            mr.buf.release()
            entry.mm.close()
        except BufferError:
            pass
        entry.segment.release()

    # ------------------------------------------------------------ rendezvous

    def _on_accept(self, _events: int) -> None:
        """Server thread: a requester came by the path (its user's directory)."""
        self._accept_all(self._listener)

    def _on_accept_abstract(self, _events: int) -> None:
        """Server thread: a requester came by the abstract name (any user of the netns)."""
        self._accept_all(self._abstract)

    def _accept_all(self, listener: socket.socket) -> None:
        """Server thread: answer hellos and MR look-ups; never takes a QP lock, and never
        waits for a requester: one whose message is not there yet is watched for it
        (:meth:`_await_first`), so that a process of the network namespace that connects
        to the abstract name and says nothing holds up nobody's hello or look-up (three
        such connections, each waited for up to a second, made a peer's look-up time out
        and its link fail)."""
        while True:
            try:
                conn = plainsock.accept(listener)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # (EMFILE...) left alone a while: it stays readable
                self._pause_accepting(listener)
                return
            conn.setblocking(False)
            if not self._first_message(conn):
                self._await_first(conn)

    def _pause_accepting(self, listener: socket.socket) -> None:
        """Server thread: stop watching ``listener`` for :data:`~smcr.plainsock.ACCEPT_PAUSE`
        seconds (an ``accept`` failed: out of descriptors or memory), then watch it again."""
        handler = self._on_accept if listener is self._listener else self._on_accept_abstract
        fd = listener.fileno()
        self._server.unwatch(fd)

        def again() -> None:
            if not self._closed:  # (level-triggered: what waits is reported at once)
                self._server.watch(fd, handler)

        self._server.call_at(monotonic() + plainsock.ACCEPT_PAUSE, again)

    def _first_message(self, conn: socket.socket) -> bool:
        """Server thread: answer a new connection's first message if it is there (the
        connection kept or closed); False where it is not there yet (nothing done)."""
        keep = False
        try:
            got = rdv.receive(conn)
            if got is not None:
                msg, fds = got
                for fd in fds:
                    os.close(fd)
                keep = self._answer(conn, msg)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            pass
        if not keep:
            conn.close()
        return True

    def _await_first(self, conn: socket.socket) -> None:
        """Server thread: watch a new connection for its first message, for at most
        :data:`FIRST_WAIT` seconds; of more than :data:`MOST_WAITING` such connections,
        the oldest is closed (each holds a descriptor of this process)."""
        if len(self._waiting) >= MOST_WAITING:
            self._forget_waiting(next(iter(self._waiting.values())))
        fd = conn.fileno()
        self._waiting[fd] = conn
        self._server.watch(fd, functools.partial(self._on_first, conn))
        self._server.call_at(monotonic() + FIRST_WAIT,
                             functools.partial(self._first_overdue, conn))  # fmt: skip

    def _on_first(self, conn: socket.socket, _events: int) -> None:
        """Server thread: a watched new connection spoke (or hung up); woken for nothing,
        it is watched on, under its first deadline (its timer still runs)."""
        fd = conn.fileno()
        if self._waiting.get(fd) is not conn:
            return
        self._server.unwatch(fd)  # (before the answer: a kept connection is watched anew)
        if self._first_message(conn):
            del self._waiting[fd]
        else:  # (still waiting: its place among the oldest kept)
            self._server.watch(fd, functools.partial(self._on_first, conn))

    def _first_overdue(self, conn: socket.socket) -> None:
        """Server thread: a new connection said nothing in :data:`FIRST_WAIT` seconds."""
        if conn.fileno() >= 0 and self._waiting.get(conn.fileno()) is conn:
            self._forget_waiting(conn)

    def _stop_waiting(self, conn: socket.socket) -> None:
        """Server thread: no longer watch a new connection for its first message."""
        fd = conn.fileno()
        self._waiting.pop(fd, None)
        self._server.unwatch(fd)

    def _forget_waiting(self, conn: socket.socket) -> None:
        """Server thread: close a new connection that said nothing."""
        self._stop_waiting(conn)
        conn.close()

    def _answer(self, conn: socket.socket, msg: rdv.Message) -> bool:
        """Answer one rendezvous request; returns whether ``conn`` is kept (it belongs to a
        QP now, or waits for the requester's next MR look-ups)."""
        if msg.kind == rdv.HELLO:
            qp = self._qps.get(msg.b)
            if qp is None:
                rdv.send(conn, rdv.Message(rdv.NACK, a=errno.ENOENT))
                return False
            token = secrets.token_bytes(GID_LEN)
            with self._lock:  # granted before the requester can show it
                self._granted[token] = qp
            if not qp.accept_inbound(conn, msg.a, msg.gid, token,
                                     bool(msg.c & rdv.HELLO_MARKS),
                                     bool(msg.c & rdv.HELLO_STANDBY)):  # fmt: skip
                with self._lock:
                    self._granted.pop(token, None)
                return False
            with self._lock:
                old = self._token_of.get(qp.qp_num)
                self._token_of[qp.qp_num] = token
                if old is not None:
                    self._granted.pop(old, None)
                if qp.qp_num not in self._qps:  # destroyed meanwhile
                    self._granted.pop(self._token_of.pop(qp.qp_num), None)
            return True
        if msg.kind == rdv.GET_MR and self._grant_mr(conn, msg.a, msg.gid):
            return self._keep_asker(conn)
        return False

    def _keep_asker(self, conn: socket.socket) -> bool:
        """Server thread: keep a look-up's connection for its requester's next look-ups (the
        RMBs of its link's next connections), which then cost no connection of their own:
        a connect, an accept and two closes were a quarter of a look-up's CPU (both ends:
        209 -> 150 us), and every connection's first WRITE to its peer looks its RMB up.
        At most :data:`MOST_ASKERS`; one that errs, hangs up or is refused is closed."""
        if len(self._askers) >= MOST_ASKERS:
            return False
        conn.setblocking(False)
        self._askers[conn.fileno()] = conn
        self._server.watch(conn.fileno(), functools.partial(self._on_ask, conn))
        return True

    def _on_ask(self, conn: socket.socket, _events: int) -> None:
        """Server thread: a kept look-up connection spoke (or hung up): answer what it asks."""
        while True:
            try:
                got = rdv.receive(conn)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                got = None
            if got is not None:
                msg, fds = got
                for fd in fds:
                    os.close(fd)
                try:
                    if msg.kind == rdv.GET_MR and self._grant_mr(conn, msg.a, msg.gid):
                        continue
                except OSError:  # (its answer did not go: a requester that does not read)
                    pass
            self._drop_asker(conn)
            return

    def _drop_asker(self, conn: socket.socket) -> None:
        """Server thread: close a kept look-up connection."""
        fd = conn.fileno()
        if self._askers.pop(fd, None) is not None:
            self._server.unwatch(fd)
        conn.close()

    def _grant_mr(self, conn: socket.socket, rkey: int, token: bytes) -> bool:
        """Hand the segment of MR ``rkey`` to the holder of ``token``, if it may have it.

        The rendezvous is open to every user of the network namespace, and the MR table
        that every peer maps names no rkey (a seal per entry instead): a segment goes
        only to a requester that shows the token of one of our QPs' inbound connection,
        for a live MR of that QP's PD, what an RNIC checks of a QP's rkey access.  A
        refused look-up also revokes the token: the requester's WR fails with a remote
        access error and its QP is dead anyway, so a legitimate peer loses nothing, and
        a peer guessing the 32-bit rkeys of other connections on the same PD gets one
        guess per connection.  So a peer gets the memory its own connection's peer may
        reach and, but for that one guess, no other.

        :returns: whether the MR was handed over (a refusal: False).
        """
        with self._lock:
            qp = self._granted.get(token)
            entry = self._remote.get(rkey)
            if qp is None or entry is None or entry.mr.pd is not qp.pd:
                if qp is not None:
                    del self._granted[token]
                rdv.send(conn, rdv.Message(rdv.NACK, a=errno.ENOENT if qp else errno.EPERM))
                return False
            mr, fd = entry.mr, entry.segment.fd
            writable = bool(mr.access & AccessFlag.REMOTE_WRITE)
            send_fd = fd if writable else os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
            # (at offset 0 the answer an older requester understands: it maps from 0)
            kind, where = ((rdv.MR_OK, bytes(GID_LEN)) if not entry.offset
                           else (rdv.MR_AT, rdv.OFFSET.pack(entry.offset)))  # fmt: skip
            try:
                answer = rdv.Message(kind, a=entry.index, b=self._gens[entry.index],
                                     c=writable, d=entry.seal, gid=where)  # fmt: skip
                rdv.send(conn, answer, [send_fd])
            finally:
                if send_fd != fd:
                    os.close(send_fd)
        return True

    # ----------------------------------------------------------------- close

    def close(self) -> None:
        """Destroy every QP, MR and CQ of the device, stop its threads, remove its socket."""
        if self._closed:
            return
        self._closed = True
        self._server.stop()
        for conn in (*self._askers.values(), *self._waiting.values()):
            conn.close()
        self._askers.clear()
        self._waiting.clear()
        self._listener.close()
        self._abstract.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        for qp in list(self._qps.values()):
            qp.destroy()
        self._deregister_all()
        self.engine.stop()
        self._close_cqs()
        self._table.close()
        os.close(self.table_fd)


class ShmPd(ProtectionDomain):
    """A protection domain of a :class:`ShmDevice`."""

    def __init__(self, device: ShmDevice, pd_id: int) -> None:
        super().__init__(pd_id)
        self.device = device

    def alloc_mr(self, length: int, access: AccessFlag,
                 segment: Segment | None = None) -> MemoryRegion:  # fmt: skip
        """Allocate ``length`` bytes in shared memory and register them.

        :param segment: where a remote-accessible MR lives (carved from it: the MRs of
            one peer share a descriptor, :mod:`~smcr.rdma.shm.segment`); None: a segment
            of its own.
        :raises VerbsError: EINVAL for REMOTE_WRITE without LOCAL_WRITE (as
            ``ibv_reg_mr``) or a bad length; ENOMEM when the MR table is full.
        :raises OSError: the segment could not grow (no memory), or was let go of.
        """
        if length <= 0 or length > self.device.attr.max_mr_size:
            raise VerbsError(errno.EINVAL, f"MR length {length}")
        if access & AccessFlag.REMOTE_WRITE and not access & AccessFlag.LOCAL_WRITE:
            raise VerbsError(errno.EINVAL, "REMOTE_WRITE needs LOCAL_WRITE")
        if not access & REMOTE_ACCESS:
            return self._register(zeroed_memory(length), access, None)
        own = segment is None
        seg = Segment("smcr-mr") if segment is None else segment
        try:
            return self._map_and_register(seg, seg.carve(length), length, access)
        finally:
            if own:
                seg.close()  # (the descriptor now lives as long as the MR)

    def _map_and_register(self, seg: Segment, offset: int, length: int,
                          access: AccessFlag) -> MemoryRegion:  # fmt: skip
        mm = map_shared(seg.fd, length, offset=offset)
        try:
            return self._register(memoryview(mm), access, (seg, offset, mm))
        except BaseException:
            mm.close()
            raise

    def reg_mr(self, buffer: bytearray | memoryview, access: AccessFlag) -> MemoryRegion:
        """Register a caller's writable buffer for local use (no remote access on shm).

        :raises VerbsError: EINVAL for remote access flags or a read-only buffer.
        """
        if access & REMOTE_ACCESS:
            raise VerbsError(errno.EINVAL, "shm: remote access needs pd.alloc_mr()")
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise VerbsError(errno.EINVAL, "buffer is read-only")
        return self._register(view, access, None)

    def alias_mr(self, mr: MemoryRegion) -> MemoryRegion:
        """Register on this PD the memory of ``mr``, an MR of another shm device's PD, with
        the same access: the same pages under this device's key and address (a runtime
        over two RNICs gives each link its rkey of one RMB, Linux ``smcr_buf_map_link``).

        A remote-accessible ``mr`` lives in a shared segment: its range is mapped again,
        so a peer's WRITE through either key lands in the same pages.

        :raises VerbsError: EINVAL when ``mr`` is not a live MR of a shm device.
        """
        if not mr.access & REMOTE_ACCESS:
            return self.reg_mr(mr.buf, mr.access)
        owner = getattr(mr.pd, "device", None)
        entry = owner._remote.get(mr.rkey) if isinstance(owner, ShmDevice) else None
        if entry is None:
            raise VerbsError(errno.EINVAL, "not a live remote-accessible shm MR")
        return self._map_and_register(entry.segment, entry.offset, mr.length, mr.access)

    def _register(
        self, view: memoryview, access: AccessFlag, shared: tuple[Segment, int, mmap] | None
    ) -> MemoryRegion:
        dev = self.device
        key = dev.keys.new_key()
        on_dereg: Callable[[MemoryRegion], None] = self._dereg
        mr = MemoryRegion(
            self, view, addr=dev.next_iova(len(view)), key=key, access=access, on_dereg=on_dereg
        )
        if shared is not None:
            try:
                dev.publish_mr(mr, *shared)
            except BaseException:
                dev.keys.release(key)
                view.release()
                raise
        self.mrs[key] = mr
        return mr

    def _dereg(self, mr: MemoryRegion) -> None:
        self.mrs.pop(mr.lkey, None)
        if mr.access & REMOTE_ACCESS:
            self.device.revoke_mr(mr)
        self.device.keys.release(mr.lkey)

    def create_qp(
        self,
        send_cq: CompletionQueue,
        recv_cq: CompletionQueue,
        cap: QpCap | None = None,
        *,
        sq_sig_all: bool = False,
    ) -> ShmQp:
        """An RC QP in RESET.

        :raises VerbsError: EINVAL for capabilities above the device's.
        """
        cap = cap or QpCap()
        a = self.device.attr
        if (
            max(cap.max_send_sge, cap.max_recv_sge) > a.max_sge
            or max(cap.max_send_wr, cap.max_recv_wr) > a.max_qp_wr
            or cap.max_inline_data > a.max_inline_data
        ):
            raise VerbsError(errno.EINVAL, f"QP capabilities {cap} above the device's")
        return self.device.new_qp(self, send_cq, recv_cq, cap, sq_sig_all)

    def dealloc(self) -> None:
        """Free the PD.

        :raises VerbsError: EBUSY while it still has MRs.
        """
        if self.mrs:
            raise VerbsError(errno.EBUSY, "PD still has memory regions")
