"""In CI a skipped test is a failure: a green run means every test ran.

Why: the tests that need the environment (root, network namespaces, ``ip``,
``nft``, ``dumpcap``, UDP port 4791, IPv6, the QEMU interop guest) skip with a
reason outside CI, which is right on a developer's machine.  In CI
(``CI=true``, as GitHub Actions, GitLab CI and ``.ci/run`` set it) the install
step puts every prerequisite there, so a skip means that step half failed, and
a run that only lists it among ``-ra`` lines would still be green.  This
plugin turns every skip into a failure naming the reason: in a test's set-up
or call (``pytest.skip``, ``skipif``, a fixture that skips) and at collection
(``pytest.skip(allow_module_level=True)``, ``importorskip``).  An expected
failure (``xfail``) stays what it is, and a test left out by ``-m`` or ``-k``
is deselected, not skipped.

Loaded by ``tests/conftest.py``; ``pytest -p tests.ci_guard`` loads it alone.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

#: Values of ``$CI`` that mean "this is a CI run" (CI services set ``true``).
CI_VALUES = frozenset({"true", "1", "yes"})


def in_ci() -> bool:
    """Whether this run is a CI run (``$CI`` is ``true``, ``1`` or ``yes``)."""
    return os.environ.get("CI", "").strip().lower() in CI_VALUES


def skip_reason(longrepr: object) -> str:
    """The reason of a skip report (pytest keeps ``(path, line, "Skipped: why")``)."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def failure_text(reason: str) -> str:
    """The failure's text: the skip's reason, and why it fails here."""
    return (
        f"skipped in CI (CI=true), where install.sh provides every prerequisite: {reason}\n"
        "A skip here means the environment is broken; fix it (outside CI it stays a skip)."
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test's skip (set-up or call) becomes a failure in CI; xfail is left alone."""
    report = yield
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = failure_text(skip_reason(report.longrepr))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """A module skipped at collection is a collection error in CI."""
    report = yield
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = failure_text(skip_reason(report.longrepr))
    return report
