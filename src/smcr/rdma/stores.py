"""Stores into memory another process reads while they happen (the shm RNIC's receive
areas and MR tables, the CQs' notification words).

``struct.pack_into`` is not such a store: it zeroes its destination before it writes
the fields, so a reader in another process sees 0 in between (a word rewritten in a
loop read 0 in one read of six here), although the word only ever held the old value
and the new one.  A slice assignment copies finished bytes, so a word goes from its old
value to its new one, an aligned word in one store, and a field written again with the
value it holds reads the same throughout.
"""

from __future__ import annotations

import struct
from typing import Any, Final

_U32_BYTES: Final = struct.Struct("<I").pack
_U64_BYTES: Final = struct.Struct("<Q").pack


def store_u32(buf: Any, offset: int, value: int) -> None:
    """Write the little-endian u32 at ``offset`` of ``buf`` (an mmap or a memoryview)."""
    buf[offset : offset + 4] = _U32_BYTES(value)


def store_u64(buf: Any, offset: int, value: int) -> None:
    """Write the little-endian u64 at ``offset`` of ``buf`` (an mmap or a memoryview)."""
    buf[offset : offset + 8] = _U64_BYTES(value)


def store(buf: Any, offset: int, layout: struct.Struct, *values: int) -> None:
    """Write ``layout``'s fields at ``offset`` of ``buf`` with one copy."""
    buf[offset : offset + layout.size] = layout.pack(*values)
