"""The field checks every encoder of :mod:`smcr.wire` runs on what it is asked to send.

Decoders raise :class:`~smcr.wire.errors.WireError` for bad *input*; these checks
raise plain :class:`ValueError`, because a field out of range on the way out is a
local bug (a caller built a message that cannot exist), not a peer's fault.  One
module, so that a CLC, LLC or RoCE field that does not fit is refused the same
way and with the same words.
"""

from __future__ import annotations

__all__ = ["check_bytes", "check_uint"]


def check_uint(name: str, value: int, bits: int) -> None:
    """Raise :class:`ValueError` unless ``0 <= value < 2**bits``.

    :param name: the field, as the message will name it.
    :param value: the value to check.
    :param bits: the field's width on the wire.
    """
    if value < 0 or value >> bits:  # (not value < 1 << bits: that makes a long for 62+ bits)
        raise ValueError(f"{name}={value!r} does not fit in {bits} bits")


def check_bytes(name: str, value: object, size: int) -> None:
    """Raise :class:`ValueError` unless ``value`` is ``bytes`` of exactly ``size``.

    :param name: the field, as the message will name it.
    :param value: the value to check (a ``bytearray`` or view is refused: the
        messages are immutable and hashable).
    :param size: the field's size on the wire.
    """
    if not isinstance(value, bytes) or len(value) != size:
        raise ValueError(f"{name} must be {size} bytes, got {value!r}")
