"""The shared words' loads, stores and fence (:mod:`smcr.rdma.shm.words`): the C calls of
the compiled build (``_place.c``) against the Python ones they stand for, their refusals,
and what another process sees while a word is rewritten."""

from __future__ import annotations

import mmap
import random
import struct
from typing import Any

import pytest

from smcr import native
from smcr.rdma import stores
from smcr.rdma.shm import words
from tests.rdma.rdma_helpers import torn_reads


def c_words() -> Any:
    if words.C_WORDS is None:
        pytest.skip("the compiled build serves the C words")
    return words.C_WORDS


def test_the_compiled_build_serves_the_c_words() -> None:
    compiled = native.status().compiled
    c = words.C_WORDS
    assert (c is not None) == compiled
    if c is not None:
        assert words.load_u64 is c.load_u64
        assert words.store_u32 is c.store_u32
        assert words.fence is c.fence
    else:
        assert words.load_u64 is words.py_load_u64 and words.store_u64 is stores.store_u64


@pytest.mark.parametrize("kind", ["mmap", "bytearray", "memoryview"])
def test_c_and_python_words_alike(kind: str) -> None:
    """Random words at random offsets (aligned and not): what the C stores the Python loads
    and the reverse, the bytes those of ``struct``'s little-endian packing, and nothing
    beside the word touched."""
    c = c_words()
    rng = random.Random(7)
    for _ in range(500):
        width = rng.choice((4, 8))
        size = 64
        raw: Any = mmap.mmap(-1, size) if kind == "mmap" else bytearray(size)
        buf = memoryview(raw) if kind == "memoryview" else raw
        buf[:] = bytes(rng.getrandbits(8) for _ in range(size))
        before = bytes(buf)
        offset = rng.randrange(0, size - width + 1)
        value = rng.getrandbits(8 * width)
        fmt = struct.Struct("<I" if width == 4 else "<Q")
        store_c = c.store_u32 if width == 4 else c.store_u64
        load_c = c.load_u32 if width == 4 else c.load_u64
        load_py = words.py_load_u32 if width == 4 else words.py_load_u64
        assert load_c(buf, offset) == load_py(buf, offset) == fmt.unpack_from(before, offset)[0]
        store_c(buf, offset, value)
        after = bytes(buf)
        assert after[offset : offset + width] == fmt.pack(value)
        assert after[:offset] == before[:offset]
        assert after[offset + width :] == before[offset + width :]
        assert load_py(buf, offset) == load_c(buf, offset) == value
        if isinstance(buf, memoryview):
            buf.release()
        if isinstance(raw, mmap.mmap):
            raw.close()


def test_the_c_words_refuse_what_the_python_refuses() -> None:
    """A word outside the buffer, a value too wide or negative, a read-only buffer for a
    store, a closed mmap (ValueError, as the Python's: the receive path's looks take
    that for a QP going): an error, and nothing written."""
    c = c_words()
    m = mmap.mmap(-1, 16)
    for off in (-1, 13, 16, 1 << 40):
        with pytest.raises(ValueError):
            c.load_u32(m, off)
        with pytest.raises(ValueError):
            c.store_u32(m, off, 1)
    for off in (9, 16):
        with pytest.raises(ValueError):
            c.load_u64(m, off)
        with pytest.raises(ValueError):
            c.store_u64(m, off, 1)
    for store, value in ((c.store_u32, 1 << 32), (c.store_u32, -1), (c.store_u64, 1 << 64),
                         (c.store_u64, -1)):  # fmt: skip
        with pytest.raises(OverflowError):
            store(m, 0, value)
    with pytest.raises(TypeError):
        c.store_u32(m, 0, "1")
    with pytest.raises(TypeError):
        c.load_u32(m)
    assert bytes(m) == bytes(16)
    frozen = bytes(8)
    with pytest.raises((BufferError, TypeError)):
        c.store_u64(frozen, 0, 5)
    assert frozen == bytes(8) and c.load_u64(frozen, 0) == 0
    m.close()
    for load in (c.load_u32, c.load_u64, words.py_load_u32, words.py_load_u64):
        with pytest.raises(ValueError):
            load(m, 0)
    with pytest.raises(ValueError):
        c.store_u32(m, 0, 1)
    c.fence()
    with pytest.raises(TypeError):
        c.fence(1)


@pytest.mark.parametrize("impl", ["c", "python"])
def test_a_reader_in_another_process_sees_old_or_new_words_only(impl: str) -> None:
    """Words rewritten in another process, each between two values whose change carries
    into higher bytes: every load sees one of the two, never a mix."""
    if impl == "c":
        c = c_words()
        st32, st64, ld32, ld64 = c.store_u32, c.store_u64, c.load_u32, c.load_u64
    else:
        st32, st64 = stores.store_u32, stores.store_u64
        ld32, ld64 = words.py_load_u32, words.py_load_u64

    def write(m: mmap.mmap, i: int) -> None:
        st32(m, 4, 0x1111FFFF + i)
        st64(m, 8, 0x22222222FFFFFFFF + i)

    def seen(m: mmap.mmap) -> object:
        a, b = ld32(m, 4), ld64(m, 8)
        if a not in (0x1111FFFF, 0x11120000) or b not in (0x22222222FFFFFFFF,
                                                          0x2222222300000000):
            return (hex(a), hex(b))
        return None

    torn, reads, code = torn_reads(write, seen)
    assert code == 0
    assert reads > 10_000
    assert not torn, f"{len(torn)} of {reads} reads torn, e.g. {torn[:3]}"
