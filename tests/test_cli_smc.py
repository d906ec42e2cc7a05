"""``smcr bench`` and ``smcr demo`` (the end-to-end SMC-R demo) run and report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_bench_json_smoke() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "smcr", "bench", "--json", "--reps", "1", "--sizes", "4096",
         "--volume", "1", "--rounds", "20"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["test"], r["size"]) for r in rows] == [
        ("throughput", 4096), ("latency", 32), ("latency", 1024)]
    for r in rows:
        assert r["smc"] > 0 and r["tcp"] > 0 and r["ratio"] == pytest.approx(r["smc"] / r["tcp"])
        assert len(r["smc_runs"]) == len(r["tcp_runs"]) == 1


@pytest.mark.slow
def test_demo_runs_smcr_end_to_end() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "smcr", "demo"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SMCR" in result.stdout and "LINK_ACTIVE" in result.stdout
    assert "SMC-R / TCP throughput" in result.stdout
