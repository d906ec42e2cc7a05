"""A third-party test suite run plainly and under ``smcr run``, for the framework tests
(:mod:`tests.run.test_tornado`, :mod:`tests.run.test_twisted`): what it ran, its result
line, its exit status, its output and how long it took, to compare the two runs."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

RAN = re.compile(r"^Ran (\d+) tests? in", re.MULTILINE)

TIMES: dict[str, tuple[float, float]] = {}
"""Suite name: (seconds plainly, seconds under ``smcr run``), for the session's summary
(``tests/run/conftest.py``)."""

T = TypeVar("T")


def side_by_side(run: Callable[[bool], T]) -> tuple[T, T]:
    """``(run(False), run(True))``, the two at the same time: the plain run in a thread
    while this one waits for the run under ``smcr run``.  Each suite is one process that
    keeps about one CPU busy, so on two CPUs the pair takes about as long as the slower
    run instead of the sum (the times recorded are then those of two suites sharing the
    machine: the ratio between them is still a fair comparison)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        plain = pool.submit(run, False)
        smc = run(True)
        return plain.result(), smc


def record_times(name: str, plain: float, smcr: float) -> None:
    """Keep how long a suite took either way, for the summary at the end of the session."""
    TIMES[name] = (plain, smcr)


@dataclass(frozen=True)
class SuiteRun:
    """One run of a suite."""

    ran: str
    result: str
    status: int
    output: str
    seconds: float

    @property
    def outcome(self) -> tuple[str, str, int]:
        """(tests run, result line, exit status): what must be the same either way."""
        return self.ran, self.result, self.status


def run_suite(suite: list[str], smcr: bool, env: dict[str, str], cwd: Path,
              result: re.Pattern[str]) -> SuiteRun:  # fmt: skip
    """Run ``suite`` (a command), under ``smcr run`` if ``smcr``; ``result`` finds its
    result line."""
    cmd = [sys.executable, "-m", "smcr", "run", "--", *suite] if smcr else suite
    cwd = cwd / ("smcr" if smcr else "plain")  # (a directory each: they may run side by side)
    cwd.mkdir(exist_ok=True)
    start = time.monotonic()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
                         check=False)  # fmt: skip
    took = time.monotonic() - start
    out = res.stdout + res.stderr
    ran, found = RAN.search(out), result.search(out)
    assert ran is not None and found is not None, out[-4000:]
    return SuiteRun(ran.group(1), found.group(0), res.returncode, out, took)
