"""Tests for smcr.wire.validate: the encoders' one set of field checks."""

from __future__ import annotations

import pytest

from smcr.wire.validate import check_bytes, check_uint


@pytest.mark.parametrize(("value", "bits"), [(0, 1), (1, 1), (255, 8), ((1 << 24) - 1, 24)])
def test_check_uint_accepts_what_fits(value: int, bits: int) -> None:
    check_uint("field", value, bits)


@pytest.mark.parametrize(("value", "bits"), [(-1, 8), (256, 8), (1 << 24, 24), (2, 1)])
def test_check_uint_refuses_what_does_not_fit(value: int, bits: int) -> None:
    with pytest.raises(ValueError, match=rf"^field={value} does not fit in {bits} bits$"):
        check_uint("field", value, bits)


def test_check_bytes() -> None:
    check_bytes("gid", bytes(16), 16)
    for bad in (bytes(15), bytes(17), bytearray(16)):
        with pytest.raises(ValueError, match="gid must be 16 bytes"):
            check_bytes("gid", bad, 16)
