"""Loads, stores and fences on the words that shm ends share across processes (receive
areas, CQ notification words): one call into C each where the compiled build serves it
(``_place.c``), else struct unpacks, slice stores (:mod:`smcr.rdma.stores`) and a lock
round trip as the fence.

Why: the receive path's hooks read and write such words several times a message (the
count a requester produced, the receives posted, the CQ's arm), and in Python each one
cost a tuple or a packed bytes object, a slice and a bound method call -- a good part of
what a round trip's hooks cost.  In C a word is one aligned access: a reader in another
process sees the old value or the new one (what :mod:`smcr.rdma.stores` guarantees too),
and the layout stays little-endian on any host.
"""

from __future__ import annotations

import importlib
import struct
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from smcr.rdma import stores

_U32_UNPACK: Final = struct.Struct("<I").unpack_from
_U64_UNPACK: Final = struct.Struct("<Q").unpack_from
_FENCE: Final = threading.Lock()


def py_load_u32(buf: Any, offset: int) -> int:
    """The little-endian u32 at ``offset`` of ``buf`` (the Python way)."""
    value: int = _U32_UNPACK(buf, offset)[0]
    return value


def py_load_u64(buf: Any, offset: int) -> int:
    """The little-endian u64 at ``offset`` of ``buf`` (the Python way)."""
    value: int = _U64_UNPACK(buf, offset)[0]
    return value


def py_fence() -> None:
    """A full memory barrier (a lock round trip is a locked instruction on x86-64)."""
    _FENCE.acquire()
    _FENCE.release()


def _c_words() -> ModuleType | None:
    """``_place.c``, built with the compiled modules and served with them (:mod:`smcr.native`);
    None in a pure-Python process."""
    try:
        return importlib.import_module("smcr.rdma.shm._place")
    except ImportError:
        return None


C_WORDS: Final = _c_words()
"""The C of these calls, or None (then the Python ones serve)."""

load_u32: Final[Callable[[Any, int], int]] = (
    C_WORDS.load_u32 if C_WORDS is not None else py_load_u32)  # fmt: skip
"""The little-endian u32 at an offset of a buffer."""
load_u64: Final[Callable[[Any, int], int]] = (
    C_WORDS.load_u64 if C_WORDS is not None else py_load_u64)  # fmt: skip
"""The little-endian u64 at an offset of a buffer."""
store_u32: Final[Callable[[Any, int, int], None]] = (
    C_WORDS.store_u32 if C_WORDS is not None else stores.store_u32)  # fmt: skip
"""Write a little-endian u32 at an offset of a buffer: a reader never sees a mix."""
store_u64: Final[Callable[[Any, int, int], None]] = (
    C_WORDS.store_u64 if C_WORDS is not None else stores.store_u64)  # fmt: skip
"""Write a little-endian u64 at an offset of a buffer: a reader never sees a mix."""
fence: Final[Callable[[], None]] = C_WORDS.fence if C_WORDS is not None else py_fence
"""A full memory barrier."""
