"""The requester's view of its responder in the shm RNIC: connection, mappings, MR look-ups.

Design: everything a requester holds of one peer QP lives in one object, so
tearing a connection down (peer death, RESET, destroy) is one ``close()`` that
releases every mapping, the peer CQ's doorbell and the socket, and nothing
leaks.  Peer memory is looked up lazily by rkey (the first WRITE/READ to a
region asks the peer's rendezvous for its segment, over a connection kept for
such look-ups) and cached; the per-WR
validity check against the live MR table stays in the QP's data path.

The peer's shared memory is written by another process, so everything read
from it is checked before use (area geometry at connect, entry bounds against
the mapped size at look-up): a broken or hostile peer gets errors, not a crash.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass, field
from mmap import mmap
from pathlib import Path
from typing import Any, Final

from smcr import plainsock
from smcr.rdma import bells
from smcr.rdma.base import PAGE, give_back_pages
from smcr.rdma.shm import layout as lay
from smcr.rdma.shm import rendezvous as rdv
from smcr.rdma.shm.cq import MARKS
from smcr.rdma.shm.mapping import map_shared
from smcr.rdma.verbs import AccessFlag, VerbsError

_REMOTE_WRITE: Final = int(AccessFlag.REMOTE_WRITE)
_MR_KEY: Final = lay.MR_KEY.unpack_from
HELLO_FLAGS = rdv.HELLO_MARKS | rdv.HELLO_STANDBY
"""What a hello asks for: this requester marks its SENDs and rings the standby doorbell (a
test may turn them off)."""


@dataclass(slots=True)
class RemoteMr:
    """A peer MR mapped into this process, with its table entry as looked up."""

    offset: int  # of its entry in the peer's MR table
    generation: int
    access: int
    pd: int
    length: int
    iova: int
    mm: mmap
    # Any, not memoryview: mypyc's dataclass with a field of that builtin type fails at import
    view: Any
    writable: bool
    seal: int  # the entry's first word while the MR lives (the table names no rkey)
    end: int = 0  # iova + length
    allowed: int = 0  # access, less REMOTE_WRITE when the mapping is read-only
    key: tuple[int, int] = (0, 0)  # (seal, generation): the live entry's first two words

    def __post_init__(self) -> None:
        self.end = self.iova + self.length
        self.key = (self.seal, self.generation)
        self.allowed = self.access if self.writable else self.access & ~_REMOTE_WRITE

    def close(self) -> None:
        """Unmap (the view first: an exported buffer cannot be unmapped)."""
        self.view.release()
        self.mm.close()


@dataclass(slots=True)
class PeerLink:
    """What the requester holds of its responder: socket, mappings, CQ doorbell."""

    sock: socket.socket
    path: str
    area: mmap
    view: Any  # memoryview (Any for mypyc, as RemoteMr.view)
    table: mmap
    bell: socket.socket  # write end of the peer's receive CQ doorbell
    depth: int  # of the peer's receive area, checked against its size at RTR
    slot_size: int
    notify: mmap | None = None  # the peer CQ's armed word (smcr.rdma.shm.cq), if it has one
    token: bytes = b""  # shown with each MR look-up: what the peer granted this connection
    mark: int = 0  # offset of the peer QP's mark byte in ``notify``, set after each SEND (0: none)
    standby_bell: socket.socket | None = None  # the peer CQ's standby doorbell, if it gave one
    bells: bytes = b""  # the peer CQ's consumer bell prefix, if it rings by name from here
    mrs: dict[int, RemoteMr] = field(default_factory=dict)
    asker: socket.socket | None = None  # the connection kept for MR look-ups (_ask)

    def close(self) -> None:
        """Release everything (mappings, doorbell, sockets)."""
        for rm in self.mrs.values():
            rm.close()
        self.mrs.clear()
        if self.asker is not None:
            self.asker.close()
            self.asker = None
        self.view.release()
        self.area.close()
        self.table.close()
        if self.notify is not None:
            self.notify.close()
        if self.standby_bell is not None:
            self.standby_bell.close()
        self.bell.close()
        self.sock.close()

    @classmethod
    def connect(cls, directory: Path, own_gid: bytes, qp_num: int, gid: bytes,
                dst_qpn: int) -> PeerLink:  # fmt: skip
        """Reach the peer QP through its device's rendezvous and map its area (at RTR).

        :raises VerbsError: EHOSTUNREACH (no such device) or ECONNREFUSED (no such QP),
            as a real RTR fails when the peer's address cannot be resolved; EPROTO
            for a malformed answer.
        """
        if not rdv.is_shm_gid(gid):
            raise VerbsError(errno.EHOSTUNREACH, f"{gid.hex()} is not a shm GID")
        sock, path = rdv.connect_any(directory, gid)
        try:
            rdv.send(sock, rdv.Message(rdv.HELLO, a=qp_num, b=dst_qpn, c=HELLO_FLAGS,
                                       gid=own_gid))  # fmt: skip
            answer = rdv.receive(sock)
            msg, fds = answer if answer is not None else (None, [])
            if msg is None or msg.kind != rdv.HELLO_OK or len(fds) not in (3, 4, 5):
                for fd in fds:
                    os.close(fd)
                raise VerbsError(errno.ECONNREFUSED, f"peer QP {dst_qpn:#x} refused")
            area_fd, bell_fd, table_fd = fds[:3]  # and the CQ's notify word, if it has one
            bell = plainsock.from_descriptor(bell_fd)
            bell.setblocking(False)
            area = lay.map_segment(area_fd)
            table = lay.map_segment(table_fd, writable=False)
            notify = lay.map_segment(fds[3]) if len(fds) >= 4 else None
            standby_bell = None
            if len(fds) == 5:
                standby_bell = plainsock.from_descriptor(fds[4])
                standby_bell.setblocking(False)
            hdr = lay.AREA_HEADER.unpack_from(area, 0)
            depth, slot_size = hdr[lay.HDR_DEPTH], hdr[lay.HDR_SLOT_SIZE]
            if (not depth or len(area) < lay.area_size(depth, slot_size)
                    or (notify is not None and len(notify) < 4)):  # fmt: skip
                what = (f"peer receive area is malformed: depth {depth}, slot size {slot_size}"
                        f", {len(area)} bytes (header {bytes(area[:32]).hex()})"
                        f", notify {len(notify) if notify is not None else '-'} bytes")  # fmt: skip
                area.close()
                table.close()
                bell.close()
                if notify is not None:
                    notify.close()
                if standby_bell is not None:
                    standby_bell.close()
                raise VerbsError(errno.EPROTO, what)
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        mark = msg.a if notify is not None and MARKS <= msg.a < len(notify) else 0
        prefix = bells.peer_prefix(notify) if notify is not None else b""
        if prefix and not bells.probe(prefix):  # (another network namespace, say)
            prefix = b""
        return cls(sock, path, area, memoryview(area), table, bell, depth, slot_size, notify,
                   msg.gid, mark, standby_bell, prefix)  # fmt: skip

    def discard(self, rkey: int, addr: int, length: int) -> int:
        """Punch the whole pages of the peer's MR ``rkey`` at ``[addr, addr + length)``
        through our mapping of it: its segment loses them, in the peer's mapping too
        (:meth:`~smcr.rdma.base.QueuePair.discard_remote`).  Only in an MR mapped by an
        earlier WRITE and still live (a look-up now would ask the peer's device), only
        inside it; returns the bytes given back."""
        rm = self.mrs.get(rkey)
        if (rm is None or not rm.writable or _MR_KEY(self.table, rm.offset) != rm.key
                or addr < rm.iova or length <= 0 or addr + length > rm.end):  # fmt: skip
            return 0
        return give_back_pages(rm.mm, addr - rm.iova, length)

    def lookup(self, rkey: int) -> RemoteMr | None:
        """Map (again) the peer region of ``rkey``; ``None`` if it has no live one.

        :raises VerbsError: EHOSTUNREACH if the peer's device does not answer.

        Per WR only the table entry's (seal, generation) words are read:
        registration writes the seal last and deregistration zeroes it first, so
        while they match the bounds and flags cached here are the live ones.
        """
        stale = self.mrs.pop(rkey, None)
        if stale is not None:  # deregistered, or its slot reused
            stale.close()
        return self._fetch(rkey)

    def _ask(self, msg: rdv.Message) -> tuple[rdv.Message, list[int]]:
        """One MR look-up over the connection kept for them, made at the first: each
        connection's first WRITE looks its peer's RMB up, and a connection of its own per
        look-up (a connect, the device's accept, two closes) was a quarter of its CPU.
        One the device closed meanwhile (it keeps so many; it closes one whose look-up it
        refused) is made anew once.

        :raises VerbsError: EHOSTUNREACH if the device is gone or does not answer."""
        for _ in range(2):
            kept = self.asker is not None
            sock = self.asker or rdv.connect(self.path)
            self.asker = None
            try:
                answer = rdv.exchange(sock, msg, self.path)
            except VerbsError:
                sock.close()
                if kept:
                    continue
                raise
            if answer[0].kind == rdv.NACK or self.asker is not None:
                sock.close()  # (refused: the device closes it; or another look-up kept one)
            else:
                self.asker = sock
            return answer
        raise VerbsError(errno.EHOSTUNREACH, f"shm device at {self.path} did not answer")

    def _fetch(self, rkey: int) -> RemoteMr | None:
        """Ask the peer's device for the segment of ``rkey`` and map the MR's range of it
        (once per MR).

        :returns: ``None`` if the peer has no such live region.
        :raises VerbsError: EHOSTUNREACH if the peer's device does not answer."""
        msg, fds = self._ask(rdv.Message(rdv.GET_MR, a=rkey, gid=self.token))
        if msg.kind not in (rdv.MR_OK, rdv.MR_AT) or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return None
        # the MR is e_len bytes at ``at`` in the segment (a link group's RMBs share one)
        at = rdv.OFFSET.unpack(msg.gid)[0] if msg.kind == rdv.MR_AT else 0
        offset = lay.table_offset(msg.a)
        in_table = offset + lay.MR_ENTRY.size <= len(self.table)
        e_len = lay.MR_ENTRY.unpack_from(self.table, offset)[4] if in_table else 0
        try:
            size = os.fstat(fds[0]).st_size
            if at % PAGE or not 0 < e_len <= size - at:
                return None  # (deregistered meanwhile, or a malformed answer)
            mm = map_shared(fds[0], e_len, bool(msg.c), at)
        finally:
            os.close(fds[0])
        e_seal, e_gen, e_access, e_pd, e_len2, e_iova = lay.MR_ENTRY.unpack_from(self.table, offset)
        # a read-only mapping faults on a write: its view refuses one in Python first
        view = memoryview(mm) if msg.c else memoryview(mm).toreadonly()
        rm = RemoteMr(offset, e_gen, e_access, e_pd, e_len, e_iova, mm, view, bool(msg.c),
                      msg.d)  # fmt: skip
        bad = e_iova + e_len > 1 << 64 or e_len2 != e_len
        if not e_seal or e_seal != msg.d or e_gen != msg.b or not e_access & lay.MR_VALID or bad:
            rm.close()  # deregistered between the answer and now
            return None
        self.mrs[rkey] = rm
        return rm
