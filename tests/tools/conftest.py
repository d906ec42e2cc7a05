"""Fixtures of the observability tests: a diag directory of the test's own, and peer
processes (:class:`tests.tools.test_observability.Proc`) ended after the test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tools.test_observability import Proc


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of the test's smcr processes: their own diag directory, so that
    other smcr processes of this host stay out of what the tools report."""
    directory = tmp_path / "diag"
    directory.mkdir(mode=0o700)
    return {**os.environ, "SMCR_DIAG_DIR": str(directory)}


@pytest.fixture
def procs(env: dict[str, str]) -> Iterator[Callable[..., Proc]]:
    """Start a peer program (``procs(ROLE, *args, netns=NS, VAR=value)``); each leaves
    normally after the test (its counters and coverage kept), or is killed."""
    made: list[Proc] = []

    def start(*args: str, netns: str | None = None, **extra: str) -> Proc:
        made.append(Proc({**env, **extra}, *args, netns=netns))
        return made[-1]

    yield start
    for p in made:
        p.stop()
