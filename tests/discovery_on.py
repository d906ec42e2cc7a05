"""Discovery for the whole test session: smcr ends speak SMC-R only where it is on.

As root (CI, and what ``install.sh`` does) the SMC TCP option is enabled for
the whole host (``smcr enable``, :mod:`smcr.discovery.bpf`) and left on, as the
install step leaves it.  Without root, loopback is listed as an SMC peer
(:mod:`smcr.discovery.policy`) for this process and the peers it starts.
Tests of the modes themselves set ``SMCR_DISCOVERY`` and the policy variables
for their own processes (:func:`discovery_env`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from smcr import discovery
from smcr.discovery import bpf


def pytest_sessionstart() -> None:
    """Turn discovery on before any test makes a connection."""
    if os.geteuid() == 0:
        try:
            bpf.enable()
        except OSError as exc:
            raise SystemExit(f"smcr enable failed as root: {exc}") from exc
    else:
        os.environ.setdefault("SMCR_PEERS", "127.0.0.0/8, ::1")
    discovery.reset()


@pytest.fixture
def discovery_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Change the discovery environment of this process (and of the peers it starts);
    afterwards the environment is as it was and discovery is chosen again."""
    yield monkeypatch
    monkeypatch.undo()
    discovery.reset()
