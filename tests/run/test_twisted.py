"""Twisted's own TCP, TLS and HTTP tests (``python -m twisted.trial``), under ``smcr run`` and
without it: the same tests run, with the same result, either way; under ``smcr run`` the
connections its ends make to each other are SMC-R (counted by ``smcr stats``).

Twisted is the second widely used event-driven framework issue 27 asks for (tornado is
the first, :mod:`tests.run.test_tornado`); its version is pinned in ``pyproject.toml``
(the ``test`` extra).  The modules chosen run every reactor Twisted has here (select,
poll, epoll, asyncio, the threaded select reactor) over plain TCP and TLS, with the
behaviours a transport meets there: listeners adopted from a descriptor
(``adoptStreamPort``), ``EMFILE`` while accepting (the reserved-descriptor recovery),
aborts from every callback (``abortConnection`` in ``resumeProducing``, producers that
raise), half-close, large writes to a peer that stopped reading, and HTTP/1.x framing.

Compared: the number of tests run, the result line (``PASSED (skips=137,
successes=989)``) and the exit status.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.run.suites import record_times, run_suite, side_by_side
from tests.run.test_cpython import smc_connections

MODULES = [
    "twisted.internet.test.test_tcp",
    "twisted.test.test_tcp",
    "twisted.internet.test.test_tls",
    "twisted.test.test_ssl",
    "twisted.web.test.test_http",
]
SUITE = [sys.executable, "-m", "twisted.trial", *MODULES]
RESULT = re.compile(r"^(PASSED|FAILED)\b.*$", re.MULTILINE)


@pytest.mark.slow
def test_twisted_suite_passes_under_smcr_run_as_without(tmp_path: Path) -> None:
    pytest.importorskip("twisted")  # (the test extra installs it; CI fails on a skip)
    pytest.importorskip("hamcrest")
    env = dict(os.environ, SMCR_DIAG_DIR=str(tmp_path / "diag"))
    plain, smc = side_by_side(lambda smcr: run_suite(SUITE, smcr, env, tmp_path, RESULT))
    assert plain.status == 0 and plain.result.startswith("PASSED"), plain.output[-4000:]
    assert smc.outcome == plain.outcome, smc.output[-6000:]
    assert smc_connections(env) > 0
    record_times("twisted", plain.seconds, smc.seconds)
