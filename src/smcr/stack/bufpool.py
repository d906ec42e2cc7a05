"""The runtime's buffer pool: RMBs and send buffers, reused with their rkey and address.

Linux keeps freed RMBs in the link group for reuse (``smcr_buf_unuse``); here a released
connection's RMB and send buffer go back to a per-(size, kind) free list and come out
again with the same rkey and address.  The buffers given back last keep their pages, up to
:data:`HOT_BYTES` in all, so that the next connection finds its memory in place (a bulk
stream's first megabytes would otherwise fault page after page: 25% of a 1 MiB stream's
throughput in ``smcr bench``); the others give their pages back to the host
(:meth:`~smcr.rdma.base.MemoryRegion.discard`), so that the memory of connections that
closed does not stay with the process.  When they go back is the executor's business
(:class:`~smcr.core.ReuseRmb`: once the peer can no longer write into the RMB).  The pool
is bounded by :attr:`BufferPool.max_buffers`; past it a handshake declines with ``MEM``.
"""

from __future__ import annotations

from collections import OrderedDict

from smcr.rdma import AccessFlag, MemoryRegion
from smcr.rdma.base import ProtectionDomain
from smcr.rdma.shm import ShmPd
from smcr.stack.hostconn import HostConn

RMB_ACCESS = AccessFlag.LOCAL_WRITE | AccessFlag.REMOTE_WRITE
HOT_BYTES = 64 << 20
"""Most bytes of pooled buffers that keep their pages (the latest given back)."""
PEER_SEARCH = 32
"""Free RMBs looked at, latest first, for one whose last connection had the same peer."""


class BufferPool:
    """RMBs and send buffers of one runtime, allocated on its first RNIC's PD."""

    def __init__(self, pd: ProtectionDomain, max_buffers: int) -> None:
        self.pd = pd
        self.max_buffers = max_buffers
        """Connections that may hold buffers at once (RMB and send buffer each)."""
        self.out = 0
        """Connections holding buffers now."""
        self.free: dict[tuple[int, bool], list[MemoryRegion]] = {}
        """(size, remote) -> buffers given back (remote: an RMB)."""
        self.hot: OrderedDict[int, MemoryRegion] = OrderedDict()
        """Pooled buffers that kept their pages, oldest first (by ``id``)."""
        self.hot_bytes = 0
        self.last_peer: dict[int, object] = {}
        """``id`` of a pooled RMB -> the peer its last connection had (:meth:`alloc`)."""

    def alloc(self, rmb_size: int, sndbuf_size: int,
              peer: object = None) -> tuple[MemoryRegion, MemoryRegion] | None:  # fmt: skip
        """An RMB and a send buffer, or None when the pool is exhausted.

        :param peer: who the connection is with (its role and the peer's address): an RMB
            whose last connection had the same peer comes first.  Its link group most
            likely kept it announced to that peer (:meth:`Rkeys.release
            <smcr.core.rkeys.Rkeys.release>`), so the new connection needs no CONFIRM
            RKEY, and no DELETE RKEY takes it back from the group it leaves: with both
            ends of connections in one process, the latest RMB given back was the other
            role's every time, and each connection cost two LLC flows.
        """
        if self.out >= self.max_buffers:
            return None
        try:
            rmb = self._take(rmb_size, True, peer)
            snd = self._take(sndbuf_size, False)
        except OSError:
            return None
        self.out += 1
        return rmb, snd

    def _take(self, size: int, remote: bool, peer: object = None) -> MemoryRegion:
        free = self.free.get((size, remote))
        if free:
            index = len(free) - 1  # (the latest given back: hot if any is)
            if peer is not None:
                for i in range(len(free) - 1, max(-1, len(free) - 1 - PEER_SEARCH), -1):
                    if self.last_peer.get(id(free[i])) == peer:
                        index = i
                        break
            mr = free.pop(index)
            self.last_peer.pop(id(mr), None)
            if self.hot.pop(id(mr), None) is not None:
                self.hot_bytes -= mr.length
            return mr
        access = RMB_ACCESS if remote else AccessFlag.LOCAL_WRITE
        return self.pd.alloc_mr(size, access)

    def give_back(self, hc: HostConn) -> None:
        """``hc``'s buffers back to the pool (their registrations on other RNICs end)."""
        for pair in hc.aliases.values():
            for alias in pair:
                alias.dereg()
        hc.aliases.clear()
        if hc.rmb_mr is not None and hc.peer is not None:
            self.last_peer[id(hc.rmb_mr)] = hc.peer
        for mr, remote in ((hc.rmb_mr, True), (hc.sndbuf_mr, False)):
            if mr is not None:
                self.free.setdefault((mr.length, remote), []).append(mr)
                self.hot[id(mr)] = mr
                self.hot_bytes += mr.length
        while self.hot_bytes > HOT_BYTES:  # the oldest give their memory back
            _, cold = self.hot.popitem(last=False)
            self.hot_bytes -= cold.length
            cold.discard()
        if hc.rmb_mr is not None:
            self.out -= 1
        hc.rmb_mr = hc.sndbuf_mr = None

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
    """``mr``'s memory registered on another RNIC's PD, same access (shm: the same shared
    segment mapped again, :meth:`ShmPd.alias_mr`)."""
    if isinstance(pd, ShmPd):
        return pd.alias_mr(mr)
    return pd.reg_mr(mr.buf, mr.access)
