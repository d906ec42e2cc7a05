"""Shared pytest configuration."""

from __future__ import annotations

from tests.support import GOLDEN

# --- CI guard (issue #14): in CI (CI=true) a skipped test fails the run; see tests/ci_guard.py.
pytest_plugins = ("tests.ci_guard",)


def pytest_sessionstart() -> None:
    """Fail at once, with a clear message, when the golden captures are missing."""
    if not GOLDEN.is_dir():
        raise SystemExit(f"golden captures not found at {GOLDEN}; set SMCR_SHARED")
