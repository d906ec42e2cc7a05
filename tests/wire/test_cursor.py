"""Tests for smcr.wire.cursor: SMC cursors (spec §4, §5).

The model: a cursor is an absolute byte offset ``a`` taken modulo
``size * 2**16``; ``wrap = (a // size) % 2**16`` and ``count = a % size``.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from smcr.wire.cursor import (
    WRAP_LIMIT,
    Cursor,
    compare,
    distance,
    distance_large,
    update_accepted,
)
from smcr.wire.errors import WireError
from tests.support import FUZZ_EXAMPLES

# Small sizes make wraps frequent; 64 KiB is Linux's default RMB (spec §5).
SIZES = st.sampled_from([1, 2, 3, 7, 16, 1000, 16384, 65536])


def model(absolute: int, size: int) -> Cursor:
    """The cursor of absolute byte offset ``absolute`` in a buffer of ``size``."""
    return Cursor((absolute // size) % WRAP_LIMIT, absolute % size)


def linux_curs_comp(old: Cursor, new: Cursor, size: int) -> int:
    """Linux smc_curs_comp, transcribed, as a reference."""
    if old.wrap > new.wrap or (old.wrap == new.wrap and old.count > new.count):
        return -distance(new, old, size)
    return distance(old, new, size)


# --- value type --------------------------------------------------------------------


def test_defaults_and_immutability() -> None:
    cursor = Cursor()
    assert (cursor.wrap, cursor.count) == (0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cursor.count = 5  # type: ignore[misc]


@given(st.integers(0, WRAP_LIMIT - 1), st.integers(0, 2**32 - 1),
       st.integers(0, WRAP_LIMIT - 1), st.integers(0, 2**32 - 1))  # fmt: skip
def test_equality_and_hash_follow_both_fields(w1: int, c1: int, w2: int, c2: int) -> None:
    """Cursors are equal exactly when wrap and count are; equal ones hash alike."""
    a, b = Cursor(w1, c1), Cursor(w2, c2)
    assert (a == b) is (w1 == w2 and c1 == c2)
    assert (a != b) is not (a == b)
    if a == b:
        assert hash(a) == hash(b)
    assert len({a, b}) == (1 if (w1, c1) == (w2, c2) else 2)


def test_equality_is_not_by_absolute_offset() -> None:
    # wrap 1, count 0 and wrap 0, count `size` name the same byte only for a known size;
    # a Cursor has none, so they differ (and swapped fields differ too).
    assert Cursor(1, 0) != Cursor(0, 16)
    assert Cursor(1, 2) != Cursor(2, 1)
    assert Cursor(1, 2) != (1, 2)  # type: ignore[comparison-overlap]  # not a tuple


def test_no_ordering_operators() -> None:
    with pytest.raises(TypeError):
        _ = Cursor(0, 1) < Cursor(0, 2)  # type: ignore[operator]


@pytest.mark.parametrize(("wrap", "count"), [(-1, 0), (65536, 0), (0, -1), (0, 1 << 32)])
def test_rejects_out_of_range_fields(wrap: int, count: int) -> None:
    with pytest.raises(ValueError):
        Cursor(wrap, count)


# --- advance (smc_curs_add) ------------------------------------------------------------


def test_advance_examples() -> None:
    size = 65536
    assert Cursor(0, 0).advance(28, size) == Cursor(0, 28)
    # Golden capture: 65508 bytes after 0:28 land on 1:0, 28 more on 1:28.
    assert Cursor(0, 28).advance(65508, size) == Cursor(1, 0)
    assert Cursor(1, 0).advance(28, size) == Cursor(1, 28)
    assert Cursor(0, 0).advance(size, size) == Cursor(1, 0)
    assert Cursor(0, 5).advance(size, size) == Cursor(1, 5)
    assert Cursor(0, 5).advance(0, size) == Cursor(0, 5)


def test_advance_wraps_u16_wrap_counter() -> None:
    assert Cursor(0xFFFF, 10).advance(6, 16) == Cursor(0, 0)
    assert Cursor(0xFFFF, 15).advance(16, 16) == Cursor(0, 15)


@pytest.mark.parametrize(
    ("cursor", "n", "size"),
    [
        (Cursor(0, 0), -1, 16),
        (Cursor(0, 0), 17, 16),
        (Cursor(0, 16), 0, 16),
        (Cursor(0, 0), 0, 0),
    ],
)
def test_advance_rejects(cursor: Cursor, n: int, size: int) -> None:
    with pytest.raises(ValueError):
        cursor.advance(n, size)


# --- validate -------------------------------------------------------------------------------


def test_validate() -> None:
    assert Cursor(3, 65535).validate(65536) == Cursor(3, 65535)
    with pytest.raises(WireError):
        Cursor(0, 65536).validate(65536)
    with pytest.raises(WireError):
        Cursor(0, 0).validate(0)


@given(st.integers(0, 0xFFFF), st.integers(0, (1 << 32) - 1), st.integers(-5, 1 << 20))
def test_validate_raises_only_wire_error(wrap: int, count: int, size: int) -> None:
    try:
        assert Cursor(wrap, count).validate(size).count < size
    except WireError:
        assert size <= 0 or count >= size


# --- distance (smc_curs_diff) and friends: examples ----------------------------------------------


def test_distance_examples() -> None:
    size = 65536
    assert distance(Cursor(0, 0), Cursor(0, 28), size) == 28
    assert distance(Cursor(0, 28), Cursor(1, 28), size) == size  # a full buffer
    assert distance(Cursor(0, 28), Cursor(1, 0), size) == 65508
    assert distance(Cursor(4, 37888), Cursor(4, 37888), size) == 0
    assert distance(Cursor(0xFFFF, 100), Cursor(0, 50), size) == size - 50
    # Backwards on the same wrap clamps to 0, as max_t(int, 0, ...) does.
    assert distance(Cursor(0, 30), Cursor(0, 10), size) == 0


def test_distance_large_examples() -> None:
    size = 1000
    assert distance_large(Cursor(0, 900), Cursor(1, 100), size) == 200
    assert distance_large(Cursor(0, 900), Cursor(3, 100), size) == size  # clamped
    assert distance_large(Cursor(0xFFFF, 900), Cursor(0, 100), size) == 200
    assert distance_large(Cursor(5, 10), Cursor(5, 20), size) == 10
    assert distance_large(Cursor(5, 20), Cursor(5, 10), size) == 0


def test_compare_examples() -> None:
    size = 1000
    assert compare(Cursor(0, 10), Cursor(0, 20), size) == 10
    assert compare(Cursor(0, 20), Cursor(0, 10), size) == -10
    assert compare(Cursor(1, 10), Cursor(0, 990), size) == -20
    assert compare(Cursor(0xFFFF, 990), Cursor(0, 10), size) == 20  # across the u16 wrap
    assert compare(Cursor(0, 10), Cursor(0xFFFF, 990), size) == -20
    # Linux's smc_curs_comp gets this sign wrong across the u16 wrap:
    assert linux_curs_comp(Cursor(0xFFFF, 990), Cursor(0, 10), size) < 0


def test_update_accepted_examples() -> None:
    assert update_accepted(Cursor(0, 0), Cursor(0, 0))
    assert update_accepted(Cursor(0, 10), Cursor(0, 20))
    assert update_accepted(Cursor(0, 10), Cursor(1, 0))
    assert not update_accepted(Cursor(0, 20), Cursor(0, 10))
    assert not update_accepted(Cursor(3, 0), Cursor(2, 999))
    # Received wrap 0 is always taken (that is how 0xFFFF -> 0 gets through).
    assert update_accepted(Cursor(0xFFFF, 10), Cursor(0, 5))
    assert update_accepted(Cursor(7, 10), Cursor(0, 5))


# --- property tests against the absolute-offset model ------------------------------------------


@st.composite
def walks(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    """(size, start offset, steps) with every step 0..size."""
    size = draw(SIZES)
    span = size * WRAP_LIMIT
    # Start anywhere, often right before the u16 wrap counter goes round.
    start = draw(st.one_of(st.integers(0, span - 1), st.integers(span - 3 * size, span - 1)))
    steps = draw(st.lists(st.integers(0, size), max_size=40))
    return size, start, steps


def check_walk_steps(walk: tuple[int, int, list[int]]) -> None:
    """Each advance lands on the model cursor and measures as its step."""
    size, start, steps = walk
    absolute = start
    cursor = model(start, size)
    for step in steps:
        new = cursor.advance(step, size)
        absolute += step
        assert new == model(absolute, size)
        new.validate(size)
        assert distance(cursor, new, size) == step
        assert distance_large(cursor, new, size) == step
        assert compare(cursor, new, size) == step
        assert update_accepted(cursor, new)
        cursor = new


def check_walk_total(walk: tuple[int, int, list[int]]) -> None:
    """The whole walk lands on the model cursor; distance_large measures it."""
    size, start, steps = walk
    total = sum(steps)
    assume(total < size * (WRAP_LIMIT - 1))
    old = model(start, size)
    new = old
    for step in steps:
        new = new.advance(step, size)
    assert new == model(start + total, size)
    assert distance_large(old, new, size) == min(total, size)


@given(walks())
def test_advance_and_distance_follow_model(walk: tuple[int, int, list[int]]) -> None:
    check_walk_steps(walk)


@given(walks())
def test_distance_large_follows_model(walk: tuple[int, int, list[int]]) -> None:
    check_walk_total(walk)


@given(SIZES, st.data())
def test_compare_follows_model(size: int, data: st.DataObject) -> None:
    span = size * WRAP_LIMIT
    a = data.draw(st.integers(0, span - 1))
    delta = data.draw(st.integers(-(span // 2), span - span // 2 - 1))
    old, new = model(a, size), model(a + delta, size)
    assert compare(old, new, size) == delta
    half = span // 2
    assert compare(new, old, size) == (-delta + half) % span - half


@given(SIZES, st.data())
def test_compare_agrees_with_linux_without_u16_wrap(size: int, data: st.DataObject) -> None:
    span = size * WRAP_LIMIT
    a = data.draw(st.integers(0, span - 1))
    delta = data.draw(st.integers(-size, size))
    b = a + delta
    assume(0 <= b < span)  # no u16 wrap between them
    old, new = model(a, size), model(b, size)
    assert compare(old, new, size) == linux_curs_comp(old, new, size) == delta


@given(SIZES, st.data())
def test_update_accepted_follows_model(size: int, data: st.DataObject) -> None:
    # A received cursor ahead of the held one by at most half the cursor space is
    # accepted; one behind it (without the wrap-0 special case) is refused.
    span = size * WRAP_LIMIT
    a = data.draw(st.integers(0, span - 1))
    ahead = data.draw(st.integers(0, span // 2 - 1))
    old = model(a, size)
    forward = model(a + ahead, size)
    if forward.wrap >= old.wrap or forward.wrap == 0:
        assert update_accepted(old, forward)
    behind = data.draw(st.integers(1, size))
    assume(a - behind >= 0)
    back = model(a - behind, size)
    assume(back.wrap != 0)
    assert not update_accepted(old, back)


@given(st.integers(0, 0xFFFF), st.integers(1, 1 << 20))
def test_u16_wrap_counter_goes_round(wrap: int, size: int) -> None:
    cursor = Cursor(wrap, 0)
    for _ in range(3):
        cursor = cursor.advance(size, size)
    assert cursor == Cursor((wrap + 3) % WRAP_LIMIT, 0)


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(walks())
def test_model_walk_slow(walk: tuple[int, int, list[int]]) -> None:
    check_walk_steps(walk)
    check_walk_total(walk)
