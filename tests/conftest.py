"""Shared pytest fixtures: where the team's shared material lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The ``shared/`` folder beside the repository (``$SMCR_SHARED`` overrides)."""
    env = os.environ.get("SMCR_SHARED")
    return Path(env) if env else REPO_ROOT.parent / "shared"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """``shared/golden``: real captures to check the codecs against."""
    path = shared_dir() / "golden"
    if not path.is_dir():
        pytest.fail(f"golden captures not found at {path}; set SMCR_SHARED")
    return path
