"""Helpers shared by the test modules."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The team's ``shared/`` folder beside the repository (``$SMCR_SHARED`` overrides).

    CI clones the repository with ``shared/`` beside it, so the golden captures
    are always there; a test that cannot find them fails rather than skips.
    """
    env = os.environ.get("SMCR_SHARED")
    return Path(env) if env else REPO_ROOT.parent / "shared"


GOLDEN = shared_dir() / "golden"
LINUX_PCAP = GOLDEN / "linux-6.12-smcr-v2-rxe.pcap"
LINUX_DECODED = GOLDEN / "linux-6.12-smcr-v2-rxe.decoded.txt"
ROCE_EXAMPLES_PCAP = GOLDEN / "rocev2-examples.pcap"
