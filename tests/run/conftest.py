"""The suites' run times, plainly and under ``smcr run``, at the end of the test session
(the issue's 1.5x bound is a benchmark figure for the notes, not an assertion)."""

from __future__ import annotations

import pytest

from tests.run.suites import TIMES


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMES:
        text = ", ".join(f"{name} {plain:.1f}/{smcr:.1f} ({smcr / plain:.2f}x)"
                         for name, (plain, smcr) in TIMES.items())  # fmt: skip
        terminalreporter.write_line(f"suite times, plainly/under smcr run (s): {text}")
