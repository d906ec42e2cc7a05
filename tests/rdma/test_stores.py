"""Stores into shared memory (:mod:`smcr.rdma.stores`): another process reading while a
word is rewritten sees its old or its new value, nothing between."""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

import pytest

from smcr.rdma.stores import store, store_u32, store_u64
from tests.rdma.rdma_helpers import torn_reads

SRC = Path(__file__).resolve().parents[2] / "src" / "smcr" / "rdma"
FIELDS = struct.Struct("<IIII")


def test_a_reader_in_another_process_sees_old_or_new_values_only() -> None:
    u32, u64 = struct.Struct("<I"), struct.Struct("<Q")

    def write(m: mmap.mmap, i: int) -> None:
        store_u32(m, 0, 0x11111111 + i)
        store_u64(m, 8, 0x2222222222 + i)
        store(m, 16, FIELDS, 7, 48, 8192, 5 + i)

    def seen(m: mmap.mmap) -> object:
        a = u32.unpack_from(m, 0)[0]
        b = u64.unpack_from(m, 8)[0]
        c = FIELDS.unpack_from(m, 16)
        if (a not in (0x11111111, 0x11111112) or b not in (0x2222222222, 0x2222222223)
                or c[:3] != (7, 48, 8192) or c[3] not in (5, 6)):  # fmt: skip
            return (a, b, c)
        return None

    torn, reads, code = torn_reads(write, seen)
    assert code == 0
    assert reads > 10_000
    assert not torn, f"{len(torn)} of {reads} reads torn, e.g. {torn[:3]}"


def test_no_module_of_the_rnics_writes_shared_memory_with_pack_into() -> None:
    """``struct.pack_into`` zeroes before it writes: what another process maps must be
    written with the stores (the wire codecs pack into private buffers; none live here)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"pack_into\b", code) and "``" not in code:
                found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("size", [4, 8])
def test_a_store_writes_little_endian_at_its_offset_only(size: int) -> None:
    buf = bytearray(b"\xee" * 24)
    value = 0x0102030405060708 & ((1 << (8 * size)) - 1)
    (store_u32 if size == 4 else store_u64)(memoryview(buf), 8, value)
    assert buf[8 : 8 + size] == value.to_bytes(size, "little")
    assert buf[:8] == b"\xee" * 8 and buf[8 + size :] == b"\xee" * (16 - size)
