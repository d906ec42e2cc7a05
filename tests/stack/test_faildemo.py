"""``smcr demo --failover`` (root): it runs to its end, shows the cut and the way back, and
exits 0 only when the bytes matched and the group has two links again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                 reason="needs root and iproute2 (network namespaces)")]


def test_smcr_demo_failover_shows_the_cut_and_the_recovery() -> None:
    res = subprocess.run([sys.executable, "-m", "smcr", "demo", "--failover"], check=False,
                         cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=os.environ | {"COLUMNS": "200"})  # fmt: skip
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    lines = out.splitlines()
    down = next(i for i, x in enumerate(lines) if "p0 set down" in x)
    up = next(i for i, x in enumerate(lines) if "p0 set up again" in x)
    assert any("SYMMETRIC" in x and "1:p0*" in x for x in lines[:down])
    assert any("SINGLE" in x and "2:p1*" in x for x in lines[down:up])
    assert "match: True" in out and "SYMMETRIC with 2 links" in out
