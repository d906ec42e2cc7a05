"""Shared mappings of a memfd that hold no descriptor.

Why: CPython's ``mmap.mmap(fd, ...)`` keeps a ``dup`` of ``fd`` for as long as the mapping
lives (``trackfd=False`` only exists from 3.13), so every mapped segment cost the process a
descriptor: two for each of our RMBs (the memfd we keep to hand to peers, and the
mapping's copy) and one for each peer RMB we write into. At a few thousand connections
that alone exhausts a process's descriptors long before its memory.

How: an anonymous ``mmap.mmap(-1, size)`` (no descriptor) reserves the address range and
gives the object that owns it; the segment is then mapped over that very range with
``MAP_FIXED``, which replaces the anonymous pages atomically. The object behaves as any
mapping of the segment: the buffer protocol, ``madvise`` (``MADV_REMOVE`` punches the
memfd), and ``close`` unmaps the range (refused while a view is exported, as always).
The segment's memory stays alive while either a mapping or a descriptor of it does.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                  ctypes.c_long]  # fmt: skip
_MAP_FIXED = 0x10  # <sys/mman.h> (the mmap module exports no MAP_FIXED)


def map_shared(fd: int, size: int, writable: bool = True, offset: int = 0) -> mmap.mmap:
    """Map ``size`` bytes of the segment ``fd`` shared, from ``offset`` (a multiple of the
    page size); ``fd`` stays the caller's (it may be closed at once: the mapping keeps the
    memory, and no descriptor).

    A read-only mapping (``writable=False``) is read-only in the kernel: a write through
    it would fault, so its users must only read it (give others ``toreadonly()`` views).

    :raises OSError: as ``mmap(2)`` (EACCES for a write mapping of a read-only descriptor).
    """
    if size <= 0:
        raise OSError(errno.EINVAL, f"cannot map {size} bytes")
    mm = mmap.mmap(-1, size)
    try:
        anchor = ctypes.c_char.from_buffer(mm)  # (an export, dropped before any close)
        address = ctypes.addressof(anchor)
        del anchor
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        got = _mmap(address, size, prot, mmap.MAP_SHARED | _MAP_FIXED, fd, offset)
        if got != address:
            err = ctypes.get_errno() or errno.ENOMEM
            raise OSError(err, f"mmap of a shared segment: {os.strerror(err)}")
    except BaseException:
        mm.close()
        raise
    return mm
