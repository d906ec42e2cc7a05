"""SMC cursors: (wrap, count) positions in a ring buffer (spec §4, §5).

Design
------
A cursor names a byte position in an RMBE (or send buffer) of ``size`` bytes:
``count`` is the offset in the buffer (u32 on the wire, always < size) and
``wrap`` counts how often the position went round the buffer (u16 on the wire,
so it wraps itself after 65535).  Together they are a position modulo
``size * 2**16``; the wrap counter is what lets a writer fill the whole buffer
(full and empty differ in wrap, not in count).

:class:`Cursor` is an immutable value; :meth:`Cursor.advance` is Linux
``smc_curs_add``.  The module functions mirror the Linux helpers in
``net/smc/smc_cdc.h``:

* :func:`distance` — ``smc_curs_diff``: bytes from ``old`` to ``new`` when
  ``old <= new`` and the distance is at most ``size`` (the normal case: one
  CDC never moves a cursor by more than one buffer).
* :func:`distance_large` — ``smc_curs_diff_large``: the same when the distance
  may exceed ``size`` (several wraps apart, including the u16 wrap counter
  going 0xFFFF -> 0), clamped to ``size`` as Linux clamps it.
* :func:`update_accepted` — the rule of ``smc_cdc_cursor_to_host`` for a cursor
  received in a CDC: a cursor that moves backwards is ignored.

Comparison (decision): Linux ``smc_curs_comp`` orders by wrap, then count, and
so gets the sign wrong once the u16 wrap counter has gone from 0xFFFF to 0.
:func:`compare` instead uses serial-number arithmetic over the whole cursor
space: the signed distance from ``old`` to ``new`` modulo ``size * 2**16``,
taken in ``[-size * 2**15, size * 2**15)``.  For the cursors Linux compares
(within one buffer of each other, no u16 wrap between them) the result is the
same as ``smc_curs_comp``; across the u16 wrap it stays right.  Cursors carry
no ordering operators of their own, so nobody compares them lexicographically
by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from smcr.wire.errors import WireError
from smcr.wire.validate import check_uint

__all__ = [
    "COUNT_LIMIT",
    "WRAP_LIMIT",
    "Cursor",
    "compare",
    "distance",
    "distance_large",
    "update_accepted",
]

WRAP_LIMIT: Final = 1 << 16
"""The wrap counter is a u16 (``smc_cdc_cursor.wrap``)."""
COUNT_LIMIT: Final = 1 << 32
"""The count is a u32 (``smc_cdc_cursor.count``)."""


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position in a ring buffer: ``wrap`` (u16) rounds plus ``count`` bytes.

    Mirrors Linux ``union smc_host_cursor`` (spec §4).  Both values start at 0.

    :param wrap: how many times the position went round the buffer, mod 2**16.
    :param count: the byte offset within the buffer.
    :raises ValueError: if ``wrap`` is not a u16 or ``count`` not a u32 (a
        programming error; decoders never build such a cursor).
    """

    wrap: int = 0
    count: int = 0

    def __post_init__(self) -> None:
        check_uint("cursor wrap", self.wrap, 16)
        check_uint("cursor count", self.count, 32)

    def advance(self, n: int, size: int) -> Cursor:
        """Return the cursor ``n`` bytes further on in a buffer of ``size`` bytes.

        Linux ``smc_curs_add``: ``count += n``; if that reaches ``size``, the
        count goes round (``count -= size``) and ``wrap`` goes up by one, mod
        2**16.

        :param n: bytes to move, ``0 <= n <= size`` (a whole buffer at most).
        :param size: the buffer (RMBE or send buffer) size in bytes, > 0.
        :returns: the advanced cursor.
        :raises ValueError: if ``n`` or ``size`` is out of range or this cursor
            is not valid for ``size``.
        """
        if size <= 0:
            raise ValueError(f"buffer size {size} must be positive")
        if not 0 <= n <= size:
            raise ValueError(f"cannot advance a cursor by {n} in a buffer of {size}")
        if self.count >= size:
            raise ValueError(f"cursor count {self.count} is outside a buffer of {size}")
        count = self.count + n
        if count >= size:
            return Cursor((self.wrap + 1) % WRAP_LIMIT, count - size)
        return Cursor(self.wrap, count)

    def validate(self, size: int) -> Cursor:
        """Check that the cursor lies inside a buffer of ``size`` bytes.

        A received cursor whose count is at or beyond the buffer size cannot
        have come from a correct peer (spec §4: count < RMBE size).  Linux does
        not check it; we do before using it to address memory.

        :param size: the buffer size in bytes.
        :returns: ``self``, for chaining.
        :raises WireError: if ``count >= size`` (or ``size`` is not positive).
        """
        if size <= 0:
            raise WireError(f"buffer size {size} must be positive")
        if self.count >= size:
            raise WireError(f"cursor count {self.count} is outside a buffer of {size} bytes")
        return self


def distance(old: Cursor, new: Cursor, size: int) -> int:
    """Bytes from ``old`` to ``new``, assuming ``old <= new`` within one buffer.

    Linux ``smc_curs_diff`` (spec §4): different wraps ->
    ``(size - old.count) + new.count``, same wrap -> ``new.count - old.count``;
    never negative.

    :param old: the earlier cursor.
    :param new: the later cursor, at most ``size`` bytes after ``old``.
    :param size: the buffer size in bytes.
    :returns: the distance in bytes, ``0 <= d <= size`` for valid cursors.
    """
    if old.wrap != new.wrap:
        return max(0, (size - old.count) + new.count)
    return max(0, new.count - old.count)


def distance_large(old: Cursor, new: Cursor, size: int) -> int:
    """Bytes from ``old`` to ``new`` when they may be many wraps apart, capped at ``size``.

    Linux ``smc_curs_diff_large``, used by ``smc_tx_consumer_update`` to
    compute the peer's free space.  Each whole wrap between them adds ``size``
    (the u16 wrap counter is taken mod 2**16, so 0xFFFF -> 0 counts as one);
    the result is clamped to ``size`` as in Linux.

    :param old: the earlier cursor.
    :param new: the later cursor.
    :param size: the buffer size in bytes.
    :returns: ``min(size, bytes from old to new)``; 0 if on the same wrap and
        ``new`` is behind ``old``.
    """
    if old.wrap != new.wrap:
        whole_wraps = (new.wrap - old.wrap - 1) % WRAP_LIMIT
        return min((size - old.count) + new.count + whole_wraps * size, size)
    return max(0, new.count - old.count)


def compare(old: Cursor, new: Cursor, size: int) -> int:
    """Signed distance from ``old`` to ``new``: > 0 if ``new`` is ahead, < 0 if behind.

    Counterpart of Linux ``smc_curs_comp`` that survives the u16 wrap counter
    going round (see the module comment): positions are taken modulo
    ``size * 2**16`` and the difference is folded into
    ``[-size * 2**15, size * 2**15)``.

    :param old: the reference cursor.
    :param new: the cursor compared with it.
    :param size: the buffer size in bytes.
    :returns: the signed distance in bytes.
    """
    span = size * WRAP_LIMIT
    diff = ((new.wrap - old.wrap) * size + new.count - old.count) % span
    return diff - span if diff >= span // 2 else diff


def update_accepted(old: Cursor, received: Cursor) -> bool:
    """Whether a cursor received in a CDC replaces the one held (spec §4).

    Linux ``smc_cdc_cursor_to_host`` ignores a received cursor that moves
    backwards: a smaller wrap (unless the received wrap is 0, which is how it
    lets the u16 wrap counter go from 0xFFFF to 0), or the same wrap and a
    smaller count.  Mirrored exactly, so that we accept what Linux accepts.

    :param old: the cursor currently held for the peer.
    :param received: the cursor carried by the new CDC.
    :returns: ``True`` if ``received`` should replace ``old``.
    """
    if old.wrap > received.wrap and received.wrap != 0:
        return False
    return not (old.wrap == received.wrap and old.count > received.count)
