"""The suite runs on its own configuration, not the host's (tests/host_isolation.py)."""

from __future__ import annotations

import os
from pathlib import Path

from smcr import settings, ueid
from tests.host_isolation import FILES, KEPT, isolate


def test_the_session_has_no_host_configuration() -> None:
    for var in settings.VARIABLES:
        if var not in FILES and var.name not in KEPT:
            assert var.name not in os.environ, var.name
    for var in FILES:
        assert Path(os.environ[var.name]).read_text() == ""
    assert ueid.load() == ()


def test_isolate_takes_out_what_configures_smcr(tmp_path: Path) -> None:
    environ = {"SMCR_UEID_FILE": "/etc/smcr/ueid", "SMCR_MAX_LINKS": "2", "SMCR_RNIC": "roce",
               "SMCR_PURE_PYTHON": "1", "SMCR_SHARED": "/x", "PATH": "/bin"}
    removed = isolate(environ, tmp_path)
    assert sorted(removed) == ["SMCR_MAX_LINKS", "SMCR_RNIC", "SMCR_UEID_FILE"]
    assert environ["SMCR_PURE_PYTHON"] == "1" and environ["SMCR_SHARED"] == "/x"
    for var in FILES:
        assert Path(environ[var.name]).parent == tmp_path
        assert Path(environ[var.name]).read_text() == ""
