"""A configuration that rules SMC out is said once by the process (issue 28), and ``smcr
chk`` names the cause and the command to fix it; ``SMCR_DISCOVERY=off`` asks for plain
TCP and is not reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = """
import smcr
srv = smcr.create_server(("127.0.0.1", 0))
for _ in range(3):
    c = smcr.create_connection(srv.getsockname())
    a, _ = srv.accept()
    assert c.smc_info().mode == "TCP" and c.smc_info().local_code == 0x03010000
    c.close(); a.close()
"""


def _env(tmp_path: Path, mode: str) -> dict[str, str]:
    """Discovery by the TCP option, whose pins are not there (as before ``smcr enable``)."""
    return {**os.environ, "SMCR_DISCOVERY": mode, "SMCR_BPF_DIR": str(tmp_path / "pins"),
            "SMCR_PEERS": ""}  # fmt: skip


def test_smc_ruled_out_is_said_once(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", PROGRAM], env=_env(tmp_path, "bpf"), cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    (line,) = res.stderr.splitlines()
    assert line.startswith("smcr: SMC-R is off in this process, its connections are plain TCP: ")
    assert "smcr enable" in line and "smcr discovery" in line


def test_smc_asked_off_is_not_reported(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", PROGRAM], env=_env(tmp_path, "off"), cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert res.stderr == ""


def test_chk_names_the_cause_and_the_fix(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "smcr", "chk", "--json"], cwd=ROOT,
                         env=_env(tmp_path, "bpf"), capture_output=True, text=True, timeout=60,
                         check=False)  # fmt: skip
    assert res.returncode == 1
    got = json.loads(res.stdout)
    assert (got["smc"], got["local_code"], got["echo_ok"]) == (False, 0x03010000, True)
    assert "SMC-R is off here (the TCP option is not enabled" in got["fix"]
    assert "'smcr enable' as root" in got["fix"] and "'smcr discovery'" in got["fix"]
    assert res.stderr == ""  # (chk says it itself, not each of its processes)
