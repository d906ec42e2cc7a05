"""``smcr bench --rnic roce --netns``: SMC-R over the RoCE RNIC beside TCP, same veth pair."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                    reason="needs root and iproute2 (network namespaces)")
def test_bench_over_roce_between_namespaces_reports_both_and_cleans_up() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "smcr", "bench", "--rnic", "roce", "--netns", "--json",
         "--sizes", "65536", "--reps", "1", "--volume", "8", "--rounds", "50"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(res.stdout)
    assert {r["test"] for r in rows} == {"throughput", "latency"}
    assert all(r["smc"] > 0 and r["tcp"] > 0 for r in rows)
    # the bench's namespaces (smcrb<its pid>a/b) are gone
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30,
                          check=True)
    assert not [line for line in left.stdout.splitlines() if line.startswith("smcrb")]
