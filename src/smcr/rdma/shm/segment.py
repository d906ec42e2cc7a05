"""A shared segment that holds remote-accessible MRs at offsets: one memfd for many.

Why: a peer reaches an MR by mapping the memfd it lives in (the descriptor goes over the
rendezvous on the peer's first WRITE), so the responder keeps that descriptor for as long
as the MR lives (to hand it to the peer, to a peer of a later connection that reuses the
RMB, and to map it again for a second RNIC).  An MR per memfd cost a descriptor per RMB,
the first thing a process with thousands of connections runs out of.  A link group's RMBs
are all written by one peer (Linux keeps them in the group, ``lgr->rmbs``), so they can
share a segment: a descriptor per group, and the peer that holds it may write nothing it
could not write already.  An MR made on its own gets a segment of its own.

The segment grows as MRs are carved from it (``ftruncate``; pages are backed only once
written) and never shrinks: an MR's pages go back to the host by punching its range
(:meth:`~smcr.rdma.base.MemoryRegion.discard`).  The descriptor is closed once the
segment's owner has let it go (:meth:`close`) and no published MR uses it any more
(:meth:`release`); the memory goes with the last mapping.
"""

from __future__ import annotations

import errno
import os
import threading

from smcr.rdma.base import PAGE


class Segment:
    """One memfd, MRs at page-aligned offsets in it (module doc)."""

    def __init__(self, name: str) -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.fchmod(self.fd, 0o600)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = 0
        """Bytes carved so far (the file's length)."""
        self.users = 0
        """Published MRs that live in it (:meth:`hold`)."""
        self.closing = False
        self._lock = threading.Lock()  # (the pool carves, a device's deregistration releases)

    def carve(self, length: int) -> int:
        """Room for ``length`` more bytes at the end: returns its offset.

        :raises OSError: as ``ftruncate`` (no memory); ``EBADF`` once let go of."""
        rounded = -(-max(length, 1) // PAGE) * PAGE
        with self._lock:
            if self.closing:
                raise OSError(errno.EBADF, "the segment was let go of")
            offset = self.size
            os.ftruncate(self.fd, offset + rounded)
            self.size = offset + rounded
        return offset

    def hold(self) -> None:
        """An MR in the segment was published: the descriptor stays for it."""
        with self._lock:
            self.users += 1

    def release(self) -> None:
        """An MR in the segment was revoked (the last closes a segment let go of)."""
        with self._lock:
            self.users -= 1
            last = self.closing and not self.users
        if last:
            os.close(self.fd)

    def close(self) -> None:
        """Its owner lets it go: the descriptor closes now, or with the last MR in it."""
        with self._lock:
            if self.closing:
                return
            self.closing = True
            last = not self.users
        if last:
            os.close(self.fd)
