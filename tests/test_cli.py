"""The ``smcr`` command: sub-commands run and say what they should."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from smcr.cli import main


def test_decline_explains_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decline", "0x03010000", "3070000", "0x99990000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "0x03010000 PEERNOSMC: peer did not indicate SMC",
        "0x03070000 DIFFPREFIX: IP prefix / subnet mismatch",
        "0x99990000 internal error (Linux 4.14)",
    ]


def test_decline_rejects_garbage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["decline", "zz"]) == 2
    assert "expected a hexadecimal code of 32 bits" in capsys.readouterr().err


@pytest.mark.tshark
def test_capture_demo_writes_a_capture_wireshark_reads(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "smcr", "demo", "--capture", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Wireshark recognises every message smcr built" in result.stdout
    pcap = tmp_path / "smcr-sample.pcap"
    assert pcap.stat().st_size > 3000
    # A second run refuses to overwrite the capture rather than clobber it.
    again = subprocess.run(
        [sys.executable, "-m", "smcr", "demo", "--capture", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert again.returncode == 1
    assert "exists already; not overwriting it" in again.stdout


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: smcr" in capsys.readouterr().out
