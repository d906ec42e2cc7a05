"""``tests/ci_guard.py``: with CI=true a skipped test fails the run; outside CI it skips.

Each case runs a small test file in a fresh pytest process with only the guard
loaded and reads the outcome of every test from its JUnit XML report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

TESTS = """
import pytest

def test_passes():
    pass

def test_skips_in_body():
    pytest.skip("needs tool-a")

@pytest.mark.skipif(True, reason="needs tool-b")
def test_skipif_marker():
    pass

@pytest.fixture
def env():
    pytest.skip("needs tool-c")

def test_fixture_skips(env):
    pass

@pytest.mark.xfail(reason="a known bug", strict=True)
def test_expected_failure():
    assert False
"""

MODULE_SKIP = """
import pytest
pytest.skip("needs tool-d", allow_module_level=True)

def test_never_collected():
    pass
"""


def run_pytest(tmp_path: Path, source: str, ci: str | None) -> tuple[int, dict[str, str], str]:
    """Run ``source`` as a test module; return the exit code, each test's outcome, the output."""
    (tmp_path / "test_case.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO_ROOT)
    xml = tmp_path / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.ci_guard", "-p", "no:cacheprovider",
         "-q", "-rA", f"--junitxml={xml}", "test_case.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    outcomes: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name", "")] = kinds[0] if kinds else "passed"
    return proc.returncode, outcomes, proc.stdout + proc.stderr


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_in_ci_every_skip_fails_loudly(tmp_path: Path, ci: str) -> None:
    code, outcomes, out = run_pytest(tmp_path, TESTS, ci)
    assert code == pytest.ExitCode.TESTS_FAILED
    assert outcomes == {
        "test_passes": "passed",
        "test_skips_in_body": "failure",
        "test_skipif_marker": "error",  # a skip at set-up: reported as a set-up error
        "test_fixture_skips": "error",
        "test_expected_failure": "skipped",  # JUnit's name for xfailed; not a failure
    }
    for tool in ("tool-a", "tool-b", "tool-c"):
        assert f"skipped in CI (CI=true), where install.sh provides every prerequisite: needs {tool}" in out  # noqa: E501
    assert "1 xfailed" in out


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_outside_ci_skips_stay_skips(tmp_path: Path, ci: str | None) -> None:
    code, outcomes, out = run_pytest(tmp_path, TESTS, ci)
    assert code == pytest.ExitCode.OK
    assert outcomes == {
        "test_passes": "passed",
        "test_skips_in_body": "skipped",
        "test_skipif_marker": "skipped",
        "test_fixture_skips": "skipped",
        "test_expected_failure": "skipped",
    }
    assert "3 skipped" in out and "1 xfailed" in out
    assert "skipped in CI" not in out


def test_module_skip_is_a_collection_error_in_ci(tmp_path: Path) -> None:
    code, _, out = run_pytest(tmp_path, MODULE_SKIP, "true")
    assert code == pytest.ExitCode.INTERRUPTED  # pytest stops on a collection error
    assert "needs tool-d" in out and "skipped in CI" in out
    code, _, out = run_pytest(tmp_path, MODULE_SKIP, None)
    assert code == pytest.ExitCode.NO_TESTS_COLLECTED
    assert "1 skipped" in out
