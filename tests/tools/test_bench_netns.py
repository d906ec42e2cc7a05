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
    with subprocess.Popen(
        [sys.executable, "-m", "smcr", "bench", "--rnic", "roce", "--netns", "--json",
         "--sizes", "65536", "--reps", "1", "--volume", "8", "--rounds", "50",
         "--connections", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-2000:]
    rows = json.loads(out)
    assert {r["test"] for r in rows} == {"throughput", "latency", "event loop", "connect",
                                          "connect to plain"}
    assert all(r["smc"] > 0 and r["tcp"] > 0 for r in rows)
    # the bench's namespaces (smcrb<its pid>a/b, smcr.tools.netns.VethPair) are gone
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30,
                          check=True)
    ours = {f"smcrb{proc.pid % 100000}a", f"smcrb{proc.pid % 100000}b"}
    assert not [line for line in left.stdout.splitlines() if line.split()[0] in ours]


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                    reason="needs root and iproute2 (network namespaces)")
def test_bench_conns_over_roce_between_namespaces() -> None:
    """``--conns``: the client in the first namespace, the server it spawns in the second."""
    got = subprocess.run(
        [sys.executable, "-m", "smcr", "bench", "--rnic", "roce", "--netns", "--json",
         "--conns", "20", "--exchanges", "5", "--reps", "1"],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    report = json.loads(got.stdout)
    assert report["ok"] and report["rnic"] == "roce"
    assert report["smcr_connections"] == 20
    assert all(r["server_smcr"] == (20 if r["kind"] == "smc" else 0) for r in report["runs"])
