"""Fixtures for the rdma tests: a private rendezvous directory and QP pairs.

``pair`` gives two shm devices in this process, connected RC QPs and the
memory each side needs; the process tests start a real peer with
``tests.rdma.shm_peer.peer_main``.  Every wait is bounded, so a failing test fails
instead of hanging.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rdma.rdma_helpers import Side, connect, make_side


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A short private directory (unix socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="smcr-t"))
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pair(shm_dir: Path) -> Iterator[tuple[Side, Side]]:
    """Two connected sides in this process (fast semantics tests)."""
    a = make_side(shm_dir, "a", 0x100)
    b = make_side(shm_dir, "b", 0xFFFFF0)
    connect(a, b)
    yield a, b
    a.dev.close()
    b.dev.close()
