"""CPython's own regression tests of the networking modules (socket, http, socketserver,
selectors, select/poll/epoll, xmlrpc, urllib, ssl, ftplib and the whole asyncio package),
under ``smcr run`` and without it: the same tests run, and pass, either way; under
``smcr run`` the connections they make between their own ends are SMC-R (counted by
``smcr stats``, :mod:`smcr.diag`).

``python -m test`` is CPython's test runner; its test package ships with the interpreter.
A module that does not pass as many tests under ``smcr run`` as without it fails here
with both summaries.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.run.suites import record_times, side_by_side
from tests.support import REPO_ROOT

MODULES = {
    # module: extra arguments for python -m test
    "test_socket": ["-i", "*VSOCK*"],  # (the VSOCK tests hang on this VM without smcr too)
    "test_httplib": [],
    "test_socketserver": [],
    "test_selectors": [],
    "test_select": [],
    "test_poll": [],
    "test_epoll": [],
    "test_xmlrpc": [],
    "test_urllib2_localnet": [],
    "test_httpservers": [],
    "test_ssl": [],
    "test_ftplib": [],  # (urgent data in line for ABOR; TLS unwrap for CCC and data channels)
    # the whole package: event loops, streams, TLS, sendfile, subprocesses; its 29 files in
    # worker processes (-j0, each under ``smcr run`` as its parent is), which keep about
    # 1.3 CPUs busy: the plain run and the one under smcr side by side still gain (85 s
    # for both instead of 134)
    "test_asyncio": ["-j0"],
}

SUMMARY = re.compile(r"^Total tests: (.*)$", re.MULTILINE)
RESULT = re.compile(r"^Result: (.*)$", re.MULTILINE)


def run_module(module: str, smcr: bool, env: dict[str, str]) -> tuple[str, str, str, float]:
    """(summary line, result, output, seconds taken) of ``python -m test MODULE``."""
    cmd = [sys.executable, "-m", "test", "-u", "network", "--timeout", "300", module,
           *MODULES[module]]  # fmt: skip
    if smcr:
        cmd = [sys.executable, "-m", "smcr", "run", "--", *cmd]
        # the runtime's threads from the start: the tests fail a test after which the
        # count of threads differs (smcr.run._start_runtime)
        env = dict(env, SMCR_RUN_EAGER="1")
    start = time.monotonic()
    res = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=900, check=False)  # fmt: skip
    took = time.monotonic() - start
    out = res.stdout + res.stderr
    summary, result = SUMMARY.search(out), RESULT.search(out)
    assert summary is not None and result is not None, out[-4000:]
    return summary.group(1), result.group(1), out, took


def smc_connections(env: dict[str, str]) -> int:
    """SMC-R connections (both roles, both versions) the host's stats count."""
    res = subprocess.run([sys.executable, "-m", "smcr", "stats", "json"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    counts = json.loads(res.stdout)["SMCR"]
    return sum(int(counts[f"{role}_v{v}_succ_cnt"]) for role in ("clnt", "srv") for v in (1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("module", list(MODULES))
def test_cpython_module_passes_under_smcr_run_as_without(module: str, tmp_path: Path) -> None:
    env = dict(os.environ, SMCR_DIAG_DIR=str(tmp_path / "diag"))
    plain, smc = side_by_side(lambda smcr: run_module(module, smcr, env))
    assert plain[1] == "SUCCESS", plain[2][-4000:]
    assert (smc[0], smc[1]) == (plain[0], plain[1]), smc[2][-6000:]
    if module not in ("test_selectors", "test_select", "test_poll"):  # (pipes, socketpairs)
        assert smc_connections(env) > 0
    record_times(module, plain[3], smc[3])
