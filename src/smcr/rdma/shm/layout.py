"""Shared-memory layouts of the shm RNIC: the MR table and the per-QP receive area.

Design: everything a requester must check or fill lives in memory the responder
shares, so an RDMA WRITE, READ or SEND costs the requester no round trip:

* **MR table** (one per device, 32-byte entries, spec §6 step 3): the responder
  publishes each remote-accessible MR's seal, access flags, bounds, PD and a
  generation; a requester checks the live entry before *every* access, so a
  deregistration (which zeroes the seal word first) revokes access at once.
* **Receive area** (one per QP): the responder's published QP state, access
  flags, ``min_rnr_timer``, ``max_dest_rd_atomic``, PD, expected PSN, the count
  of posted receives and their lengths (what a requester needs for RNR and
  length checks), and one slot per receive for the SEND payload the requester
  copies in.  ``posted`` is written only by the responder and ``produced`` only
  by the requester, so neither needs a lock; each side stores the counter after
  the data it covers, which x86-64's total store order makes visible in that
  order (a weakly ordered CPU would need a release fence here).

All segments are ``memfd_create`` files: they have no name under /dev/shm, the
kernel frees them when the last descriptor and mapping are gone (also after
SIGKILL), and they are passed only by SCM_RIGHTS, so the 0600 mode of the
issue holds trivially (``fchmod`` makes it explicit).
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Final

from smcr.rdma.shm.mapping import map_shared

#: seal u32, generation u32, access u32 (bit 31: valid), pd u32, length u64, iova u64.
#: seal and generation come first and together: the per-WR check reads just them.  The
#: seal is a random word, not the rkey: every peer maps the table, and an rkey is
#: for the connection it was sent on (CLC, CONFIRM RKEY) only.
MR_ENTRY: Final = struct.Struct("<IIIIQQ")
MR_KEY: Final = struct.Struct("<II")
MR_VALID: Final = 1 << 31
MR_TABLE_HEADER: Final = 64

#: state, access, min_rnr_timer, max_dest_rd_atomic, pd, depth, slot_size, epsn,
#: posted u64, produced u64; read by index with the ``HDR_*`` names below.
AREA_HEADER: Final = struct.Struct("<IIIIIIIIQQ")
#: Indices of the fields in the tuple ``AREA_HEADER.unpack`` returns (``Final`` ints,
#: inlined by the compiled build): the data path reads the whole header at once.
HDR_STATE: Final = 0
HDR_ACCESS: Final = 1
HDR_MIN_RNR: Final = 2
HDR_MAX_DEST_RD_ATOMIC: Final = 3
HDR_PD: Final = 4
HDR_DEPTH: Final = 5
HDR_SLOT_SIZE: Final = 6
HDR_EPSN: Final = 7
HDR_POSTED: Final = 8
HDR_PRODUCED: Final = 9
AREA_FIELDS: Final = struct.Struct("<IIIIIII")
AREA_HEADER_SIZE: Final = 64
OFF_STATE: Final = 0
OFF_MIN_RNR: Final = 8
OFF_EPSN: Final = 28
OFF_POSTED: Final = 32
OFF_PRODUCED: Final = 40
U32: Final = struct.Struct("<I")
U64: Final = struct.Struct("<Q")

#: Slot header: byte_len u32, kind u32, imm u32, reserved u32.
SLOT_HEADER: Final = struct.Struct("<IIII")
KIND_SEND: Final = 1
KIND_WRITE_IMM: Final = 2
KIND_SEND_IMM: Final = 3
KIND_LEN_ERR: Final = 4


def new_segment(name: str, size: int) -> tuple[int, mmap.mmap]:
    """Create a memfd of ``size`` bytes, mode 0600, and map it shared read/write.

    :returns: the descriptor (kept for passing to peers) and the mapping (which holds
        no descriptor of its own).
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, max(size, 1))
        return fd, map_shared(fd, max(size, 1))
    except BaseException:
        os.close(fd)
        raise


def map_segment(fd: int, writable: bool = True) -> mmap.mmap:
    """Map a segment received from a peer (its whole length) and close ``fd``.

    Closing at once, and a mapping that keeps no copy (:mod:`~smcr.rdma.shm.mapping`),
    are why a live connection holds no descriptor per peer MR.
    """
    try:
        return map_shared(fd, os.fstat(fd).st_size, writable)
    finally:
        os.close(fd)


def area_size(depth: int, slot_size: int) -> int:
    """Bytes of a receive area with ``depth`` slots of ``slot_size`` payload bytes."""
    return AREA_HEADER_SIZE + 4 * depth + depth * (SLOT_HEADER.size + slot_size)


def lens_offset(index: int) -> int:
    """Offset of the length word of receive ``index`` (already reduced modulo depth)."""
    return AREA_HEADER_SIZE + 4 * index


def slot_offset(depth: int, slot_size: int, index: int) -> int:
    """Offset of slot ``index``'s header; its payload follows the 16-byte header."""
    return AREA_HEADER_SIZE + 4 * depth + index * (SLOT_HEADER.size + slot_size)


def table_offset(index: int) -> int:
    """Offset of MR table entry ``index``."""
    return MR_TABLE_HEADER + index * MR_ENTRY.size


def table_size(entries: int) -> int:
    """Bytes of an MR table with ``entries`` entries."""
    return MR_TABLE_HEADER + entries * MR_ENTRY.size
