"""Shared pytest configuration."""

from __future__ import annotations

from tests.support import GOLDEN


def pytest_sessionstart() -> None:
    """Fail at once, with a clear message, when the golden captures are missing."""
    if not GOLDEN.is_dir():
        raise SystemExit(f"golden captures not found at {GOLDEN}; set SMCR_SHARED")
