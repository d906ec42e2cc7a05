"""``tests/ci_guard.py``: with CI=true a skipped test fails the run; outside CI it skips.

Each case runs a small test file in a fresh pytest process with only the guard
loaded and reads the outcome of every test from its JUnit XML report.
"""

from __future__ import annotations

import os
import shutil
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


# -- the suite's own prerequisites, taken away --------------------------------------------
#
# The cases above show the mechanism; these take a real prerequisite away from real test
# modules of the suite (the ones issue #14 names) and check that CI fails on each, naming
# it, while outside CI each stays a skip.  Every selected test stops at its skip, before
# any network, namespace or guest is touched.

#: Tests that need a tool from ``PATH``: the interop guest (qemu, debootstrap, tcpdump,
#: nft), a capture (dumpcap), network namespaces (ip), and the reason each gives as root.
NEEDS_TOOLS = {
    "tests/interop/test_rxe.py::test_connect_exchanges_attributes":
        "needs qemu-system-x86_64",
    "tests/roce/test_capture.py::test_capture_decodes_in_tshark_and_every_icrc_is_right[4]":
        "needs dumpcap/tshark",
    "tests/socket/test_smcsocket.py::test_ipv6[roce]":
        "needs root and iproute2 (network namespaces)",
    "tests/tools/test_bench_netns.py::test_bench_over_roce_between_namespaces_reports_both_and_cleans_up":
        "needs root and iproute2 (network namespaces)",
}  # fmt: skip

#: A plugin that holds UDP port 4791 for the whole run (as a loaded rdma_rxe does).
HOLD_ROCE_PORT = """
import socket
HELD = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
HELD.bind(("0.0.0.0", 4791))
"""

#: Runs its command line with ``/proc/net`` empty, as on a kernel without IPv6: a tmpfs
#: over this process's ``/proc/<pid>/net``, then exec (the pid, so ``/proc/self``, stays).
HIDE_PROC_NET = """
import os, subprocess, sys
subprocess.run(["mount", "-t", "tmpfs", "none", f"/proc/{os.getpid()}/net"], check=True)
assert not os.path.exists("/proc/net/if_inet6")
os.execv(sys.argv[1], sys.argv[1:])
"""


def run_suite(tmp_path: Path, tests: list[str], ci: str | None, *, wrap: list[str] | None = None,
              env: dict[str, str] | None = None,
              ) -> tuple[int, dict[str, tuple[str, str]], str]:  # fmt: skip
    """Run some of the suite's own tests (from the repository); return the exit code, each
    test's outcome and message (``"path::name"``), the output.  ``wrap`` goes before the
    interpreter (``unshare ...``)."""
    base = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        base["CI"] = ci
    xml = tmp_path / "suite.xml"
    proc = subprocess.run(
        [*(wrap or []), sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
         f"--junitxml={xml}", *tests],
        cwd=REPO_ROOT, env=base | (env or {}), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        kinds = [(c.tag, c.get("message", "")) for c in case if c.tag in ("failure", "error", "skipped")]  # noqa: E501
        outcomes[f"{path}::{case.get('name', '')}"] = kinds[0] if kinds else ("passed", "")
    return proc.returncode, outcomes, proc.stdout + proc.stderr


@pytest.mark.parametrize("ci", ["true", None])
def test_missing_tools_fail_the_suite_in_ci_and_skip_outside(tmp_path: Path,
                                                              ci: str | None) -> None:  # fmt: skip
    """``PATH`` empty: no qemu, dumpcap, ip, nft (install.sh half failed)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    code, outcomes, out = run_suite(tmp_path, list(NEEDS_TOOLS), ci, env={"PATH": str(empty)})
    assert set(outcomes) == set(NEEDS_TOOLS), out
    for test, reason in NEEDS_TOOLS.items():
        kind, message = outcomes[test]
        if ci:
            assert kind == "error" and "skipped in CI (CI=true)" in message, (test, out)
        else:
            assert kind == "skipped" and "skipped in CI" not in message, (test, out)
        if os.geteuid() == 0:  # without root, "needs root" comes first
            assert reason in message, (test, message)
    assert code == (pytest.ExitCode.TESTS_FAILED if ci else pytest.ExitCode.OK), out


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
                    reason="needs root, unshare and ip (a namespace of its own)")  # fmt: skip
@pytest.mark.parametrize("ci", ["true", None])
def test_a_taken_roce_port_fails_the_suite_in_ci_and_skips_outside(
        tmp_path: Path, ci: str | None) -> None:  # fmt: skip
    """UDP 4791 held (in a namespace of the run's own, so that nobody else's RoCE is hit):
    the RoCE loopback tests and the socket tests over RoCE-on-loopback."""
    (tmp_path / "hold_roce_port.py").write_text(HOLD_ROCE_PORT)
    tests = ["tests/roce/test_loopback.py::test_rnr_then_delivery[gso]",
             "tests/roce/test_qp_input.py",
             "tests/socket/test_smcsocket.py::test_ipv6[roce-lo]"]  # fmt: skip
    code, outcomes, out = run_suite(
        tmp_path, [*tests, "-p", "hold_roce_port"], ci,
        wrap=["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"],
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO_ROOT)])},
    )  # fmt: skip
    assert len(outcomes) >= 3, out
    for test, (kind, message) in outcomes.items():
        assert "UDP port 4791 is taken" in message, (test, message)
        assert kind == ("error" if ci else "skipped"), (test, out)
    assert code == (pytest.ExitCode.TESTS_FAILED if ci else pytest.ExitCode.OK), out


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare (a mount namespace of its own)")  # fmt: skip
@pytest.mark.parametrize("ci", ["true", None])
def test_no_ipv6_fails_the_suite_in_ci_and_skips_outside(tmp_path: Path, ci: str | None) -> None:
    """``/proc/net/if_inet6`` missing (a kernel without IPv6)."""
    (tmp_path / "hide_proc_net.py").write_text(HIDE_PROC_NET)
    test = "tests/roce/test_loopback.py::test_ipv6_two_rnics_on_one_address"
    code, outcomes, out = run_suite(
        tmp_path, [test], ci,
        wrap=["unshare", "-m", "--propagation", "private", sys.executable,
              str(tmp_path / "hide_proc_net.py")],
    )  # fmt: skip
    kind, message = outcomes[test]
    assert kind == ("error" if ci else "skipped") and "no IPv6" in message, out
    assert code == (pytest.ExitCode.TESTS_FAILED if ci else pytest.ExitCode.OK), out
