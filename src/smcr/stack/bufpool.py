"""The runtime's buffer pool: RMBs and send buffers, reused with their keys.

Linux keeps a link group's RMBs in the group (``lgr->rmbs``) and reuses a freed one for
the group's next connection (``smcr_buf_unuse``).  On the shm RNIC, so does the pool: a
connection reserves its send buffer when its handshake starts (:meth:`BufferPool.reserve`)
and gets its RMB once the engine has chosen the link group (:meth:`BufferPool.place`, the
engine's ``Provider.place_rmb``), from the RMBs that group's connections gave back, else
carved from the group's one shared segment (:mod:`smcr.rdma.shm.segment`): a descriptor
per group, not per connection, and the peer that maps the segment gets nothing it could
not write already.  An RMB given back is still announced to the group's peer
(:meth:`Rkeys.release <smcr.core.rkeys.Rkeys.release>`), so the group's next connection
needs no CONFIRM RKEY.  When a group ends, its RMBs are deregistered as they come back,
and the segment goes with the last.

On a RoCE RNIC an RMB holds no descriptor, and the pool takes it with the send buffer when
the handshake starts, from one free list for every group (an RMB whose last connection had
the same peer first: :data:`PEER_SEARCH`); :meth:`BufferPool.place` hands that one back.

The buffers given back last keep their pages, up to :data:`HOT_BYTES` in all, so that the
next connection finds its memory in place (a bulk stream's first megabytes would
otherwise fault page after page: 25% of a 1 MiB stream's throughput in ``smcr bench``);
the others give their pages back to the host
(:meth:`~smcr.rdma.base.MemoryRegion.discard`), so that the memory of connections that
closed does not stay with the process.  When they go back is the executor's business
(:class:`~smcr.core.ReuseRmb`: once the peer can no longer write into the RMB).  The pool
is bounded by :attr:`BufferPool.max_buffers` connections; past it a handshake declines
with ``MEM``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from smcr.rdma import AccessFlag, MemoryRegion
from smcr.rdma.base import ProtectionDomain
from smcr.rdma.shm import ShmPd
from smcr.rdma.shm.segment import Segment
from smcr.rdma.verbs import VerbsError
from smcr.stack.hostconn import HostConn

RMB_ACCESS = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE
PEER_SEARCH = 32
"""Free RoCE RMBs looked at, latest first, for one whose last connection had the same peer."""
HOT_BYTES = 64 << 20
"""Most bytes of pooled buffers that keep their pages (the latest given back)."""


@dataclass(eq=False)
class GroupRmbs:
    """A link group's RMBs: where they are carved from, and those given back by size."""

    segment: Segment | None = None
    """The shm segment of the group's RMBs (made with the first)."""
    free: dict[int, list[MemoryRegion]] = field(default_factory=dict)
    out: int = 0
    """RMBs of the group that connections hold."""
    ended: bool = False

    def let_go(self) -> None:
        """Close the group's segment (the RMBs carved from it go with it)."""
        if self.segment is not None:
            self.segment.close()
            self.segment = None


class BufferPool:
    """RMBs and send buffers of one runtime, allocated on its first RNIC's PD."""

    def __init__(self, pd: ProtectionDomain, max_buffers: int,
                 grouped: bool | None = None) -> None:  # fmt: skip
        self.pd = pd
        self.max_buffers = max_buffers
        """Connections that may hold buffers at once (RMB and send buffer each)."""
        self.grouped = isinstance(pd, ShmPd) if grouped is None else grouped
        """Whether RMBs are placed per link group, in its segment (by default: on shm)."""
        self.out = 0
        """Connections holding buffers now (a send buffer reserved)."""
        self.free: dict[int, list[MemoryRegion]] = {}
        """Size -> send buffers given back."""
        self.groups: dict[int, GroupRmbs] = {}
        """Link group id -> its RMBs (shm)."""
        self.free_rmbs: dict[int, list[MemoryRegion]] = {}
        """Size -> RMBs given back, of any group (RoCE)."""
        self.last_peer: dict[int, object] = {}
        """``id`` of a pooled RMB (RoCE) -> the peer its last connection had."""
        self.hot: OrderedDict[int, MemoryRegion] = OrderedDict()
        """Pooled buffers that kept their pages, oldest first (by ``id``)."""
        self.hot_bytes = 0

    def reserve(self, hc: HostConn, sndbuf_size: int, rmb_size: int,
                peer: object = None) -> bool:  # fmt: skip
        """A handshake starts: ``hc`` gets its send buffer (on RoCE its RMB too), and a
        place among the connections that hold buffers; False when the pool is exhausted
        (or out of memory): the handshake declines ``MEM``.

        :param peer: who the connection is with (its role and the peer's address), for
            RoCE: an RMB whose last connection had the same peer comes first.  Its link
            group most likely kept it announced to that peer, so the new connection needs
            no CONFIRM RKEY, and no DELETE RKEY takes it back from the group it leaves.
        """
        if self.out >= self.max_buffers:
            return False
        free = self.free.get(sndbuf_size)
        try:
            hc.sndbuf_mr = (self._unpool(free.pop()) if free
                            else self.pd.alloc_mr(sndbuf_size, AccessFlag.LOCAL_WRITE))  # fmt: skip
        except (OSError, VerbsError):
            return False
        if not self.grouped:
            try:
                hc.rmb_mr = self._take_rmb(rmb_size, peer)
            except (OSError, VerbsError):
                self.free.setdefault(sndbuf_size, []).append(hc.sndbuf_mr)
                hc.sndbuf_mr = None
                return False
        self.out += 1
        return True

    def _take_rmb(self, size: int, peer: object) -> MemoryRegion:
        """A RoCE RMB from the free list (the latest given back, or the latest of the
        last :data:`PEER_SEARCH` whose last connection had ``peer``), else a new one."""
        free = self.free_rmbs.get(size)
        if not free:
            return self.pd.alloc_mr(size, RMB_ACCESS)
        index = len(free) - 1
        if peer is not None:
            for i in range(len(free) - 1, max(-1, len(free) - 1 - PEER_SEARCH), -1):
                if self.last_peer.get(id(free[i])) == peer:
                    index = i
                    break
        mr = free.pop(index)
        self.last_peer.pop(id(mr), None)
        return self._unpool(mr)

    def place(self, hc: HostConn, lgr_id: int, size: int) -> MemoryRegion | None:
        """``hc``'s RMB of ``size`` bytes in link group ``lgr_id`` (shm: one its
        connections gave back, the latest first, else a new one in its segment; RoCE: the
        one :meth:`reserve` took); None when there is no memory."""
        if not self.grouped:
            return hc.rmb_mr
        group = self.groups.get(lgr_id)
        if group is None:
            group = self.groups[lgr_id] = GroupRmbs()
        free = group.free.get(size)
        try:
            if free:
                mr = self._unpool(free.pop())
            else:
                if group.segment is None:
                    group.segment = Segment("smcr-rmbs")
                assert isinstance(self.pd, ShmPd)
                mr = self.pd.alloc_mr(size, RMB_ACCESS, group.segment)
        except (OSError, VerbsError):
            return None
        group.out += 1
        hc.rmb_mr, hc.rmb_group = mr, lgr_id
        return mr

    def _unpool(self, mr: MemoryRegion) -> MemoryRegion:
        if self.hot.pop(id(mr), None) is not None:
            self.hot_bytes -= mr.length
        return mr

    def _pool(self, mr: MemoryRegion) -> None:
        self.hot[id(mr)] = mr
        self.hot_bytes += mr.length

    def give_back(self, hc: HostConn) -> None:
        """``hc``'s buffers back to the pool (their registrations on other RNICs end; an
        RMB of a shm group that has ended is deregistered)."""
        for pair in hc.aliases.values():
            for alias in pair:
                alias.dereg()
        hc.aliases.clear()
        rmb, snd = hc.rmb_mr, hc.sndbuf_mr
        hc.rmb_mr = hc.sndbuf_mr = None
        if snd is not None:
            self.free.setdefault(snd.length, []).append(snd)
            self._pool(snd)
            self.out -= 1
        if rmb is not None and not self.grouped:
            self.free_rmbs.setdefault(rmb.length, []).append(rmb)
            self._pool(rmb)
            if hc.peer is not None:
                self.last_peer[id(rmb)] = hc.peer
        elif rmb is not None:
            group = self.groups.get(hc.rmb_group)
            if group is None or group.ended:
                rmb.dereg()
            else:
                group.free.setdefault(rmb.length, []).append(rmb)
                self._pool(rmb)
            if group is not None:
                group.out -= 1
                self._drop_if_done(hc.rmb_group, group)
        while self.hot_bytes > HOT_BYTES:  # the oldest give their memory back
            _, cold = self.hot.popitem(last=False)
            self.hot_bytes -= cold.length
            cold.discard()

    def group_ended(self, lgr_id: int) -> None:
        """Link group ``lgr_id`` is gone: its pooled RMBs are deregistered, those still
        held when they come back (:meth:`give_back`), and its segment goes with the last."""
        group = self.groups.get(lgr_id)
        if group is None:
            return
        group.ended = True
        for free in group.free.values():
            for mr in free:
                self._unpool(mr).dereg()
        group.free.clear()
        self._drop_if_done(lgr_id, group)

    def _drop_if_done(self, lgr_id: int, group: GroupRmbs) -> None:
        """Forget an ended group none of whose RMBs is held any more: its segment goes."""
        if group.ended and group.out == 0:
            group.let_go()
            self.groups.pop(lgr_id, None)

    def close(self) -> None:
        """The runtime ends: every group's segment is let go of (the device's close
        deregisters the MRs still in them)."""
        for group in self.groups.values():
            group.let_go()
        self.groups.clear()

    def alias(self, hc: HostConn, port: int, pd: ProtectionDomain) -> tuple[int, int]:
        """``hc``'s RMB registered on another port's RNIC (``pd``) too, with its send buffer
        for local access (WRITEs posted on that port's QPs take it as source): the
        RMB's (rkey, vaddr) there.  They are deregistered in :meth:`give_back`.

        :raises ValueError: ``hc`` has no buffers, or ``port`` is the first RNIC's.
        """
        if hc.rmb_mr is None or hc.sndbuf_mr is None or port == 0:
            raise ValueError(f"connection {hc.conn_id}: no buffers to register on port {port}")
        pair = hc.aliases.get(port)
        if pair is None:
            rmb = _alias(pd, hc.rmb_mr)
            try:
                pair = hc.aliases[port] = (rmb, _alias(pd, hc.sndbuf_mr))
            except BaseException:
                rmb.dereg()
                raise
        return pair[0].rkey, pair[0].addr


def _alias(pd: ProtectionDomain, mr: MemoryRegion) -> MemoryRegion:
    """``mr``'s memory registered on another RNIC's PD, same access (shm: the same range of
    its shared segment mapped again, :meth:`ShmPd.alias_mr`)."""
    if isinstance(pd, ShmPd):
        return pd.alias_mr(mr)
    return pd.reg_mr(mr.buf, mr.access)
