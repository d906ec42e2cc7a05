"""Bad input to the ``smcr`` command (issue 28): every sub-command, every ``SMCR_*``
variable.  Each is one line on standard error that names the bad value and what is
allowed (or what is missing), a non-zero exit status, and never a traceback.

In-process (``main``) for the many cases, and through ``python -m smcr`` for a few,
where a traceback would show.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smcr import settings
from smcr.cli import EXIT_STATUS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent

#: Sub-command -> bad invocations: (arguments, environment, exit status, text the line names).
CASES: dict[str, list[tuple[list[str], dict[str, str], int, str]]] = {
    "decline": [(["0x123456789"], {}, 2, "'0x123456789'"), (["zz"], {}, 2, "'zz'")],
    "demo": [([], {"SMCR_RNIC": "bogus"}, 2, "SMCR_RNIC='bogus'"),
             (["--capture", "--out", "/proc/self/nope"], {}, 1, "/proc/self/nope")],
    "bench": [(["--sizes", "abc"], {}, 2, "'abc'"), (["--sizes", "0"], {}, 2, "'0'"),
              (["--reps", "0"], {}, 2, "'0'"), (["--volume", "-1"], {}, 2, "'-1'"),
              (["--rounds", "x"], {}, 2, "'x'"), (["--mtu", "100"], {}, 2, "'100'"),
              (["--rnic", "rxe"], {}, 2, "'rxe'"), (["--load", "-1"], {}, 2, "'-1'"),
              (["--cpus", "4096"], {}, 2, "'4096'"), (["--cpus", "a-b"], {}, 2, "'a-b'"),
              (["--plot", "/nonexistent/dir/bench.svg"], {}, 2, "no such directory"),
              (["--conns", "0"], {}, 2, "'0'"), (["--conns", "abc"], {}, 2, "'abc'"),
              (["--conns", "-5"], {}, 2, "'-5'"), (["--exchanges", "0"], {}, 2, "'0'"),
              (["--conns", "10", "--plot", "bench.svg"], {}, 2, "--plot")],
    "device": [(["list"], {}, 2, "'list'")],
    "enable": [(["--cgroup", "/nonexistent"], {}, 2, "'/nonexistent'")],
    "disable": [(["now"], {}, 2, "now")],
    "run": [(["-r", "12", "true"], {}, 2, "'12'"), (["-t", "2g", "true"], {}, 2, "'2g'"),
            ([], {}, 2, "no command")],
    "discovery": [([], {"SMCR_DISCOVERY": "sometimes"}, 2, "SMCR_DISCOVERY='sometimes'")],
    "ueid": [(["add"], {}, 2, "needs a UEID"), (["add", "bad ueid!"], {}, 1, "'bad ueid!'"),
             (["list"], {}, 2, "'list'")],
    "pnet": [(["del"], {}, 2, "needs a PNET ID"), (["add", "NET1"], {}, 1, "-I"),
             (["add", "not valid!", "-I", "lo"], {}, 1, "'not valid!'")],
    "ss": [(["--bogus"], {}, 2, "--bogus")],
    "stats": [(["clear"], {}, 2, "'clear'")],
    "linkgroup": [(["list"], {}, 2, "'list'")],
    "info": [([], {"SMCR_MAX_LINKS": "7"}, 2, "SMCR_MAX_LINKS='7'")],
    "chk": [(["-S", "-p", "99999"], {}, 2, "'99999'"), (["-p", "x"], {}, 2, "'x'")],
    "top": [(["--interval", "-1"], {}, 2, "'-1'"), (["-n", "-2"], {}, 2, "'-2'")],
    "trace": [(["-w", "x.pcap", "-s", "9999"], {}, 2, "'9999'"),
              (["-w", "x.pcap", "-c", "0"], {}, 2, "'0'"),
              (["-w", "x.pcap", "--duration", "0"], {}, 2, "'0'"),
              (["-w", "x.pcap", "-p", "0"], {}, 2, "'0'"), ([], {}, 2, "-w")],
}  # fmt: skip

#: A value that is not allowed, for every variable that has values to refuse.
BAD_VALUES = {
    "SMCR_RNIC": "bogus", "SMCR_DISCOVERY": "sometimes", "SMCR_PEERS": "1.2.3.4:x",
    "SMCR_TCP_PORTS": "80-70",
    "SMCR_TESTLINK_TIME": "soon", "SMCR_MAX_LINKS": "7", "SMCR_AUTOCORK": "-1",
    "SMCR_SHM_RNICS": "0", "SMCR_ROCE_DEVS": "nosuchdev0", "SMCR_ROCE_POLLER_RX": "maybe",
    "SMCR_SPIN_US": "-5", "SMCR_DEBUG": "loud", "SMCR_DIAG": "2", "SMCR_PURE_PYTHON": "yes!",
    "SMC_RCVBUF": "12", "SMC_SNDBUF": "x", "SMCR_RUN": "2", "SMCR_RUN_DEBUG": "on?",
    "SMCR_RUN_EAGER": "eager",
}  # fmt: skip


def _commands() -> set[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_every_sub_command_has_bad_cases() -> None:
    assert set(CASES) == _commands()


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("command", "args", "env", "status", "names"),
                         [(c, *case) for c, cases in CASES.items() for case in cases])  # fmt: skip
def test_bad_input_is_one_line_and_an_exit_status(
    command: str, args: list[str], env: dict[str, str], status: int, names: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        got = main([command, *args])
    except SystemExit as exc:  # argparse's own exit (our Parser.error)
        got = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    line = _one_line(out.err)
    assert got == status, line
    assert line.startswith(f"smcr {command}: "), line
    assert names in line, line
    assert status in EXIT_STATUS


def test_every_variable_is_checked() -> None:
    checked = {var.name for var in settings.VARIABLES if var.parse.__name__ != "_path"}
    assert checked == set(BAD_VALUES)


@pytest.mark.parametrize(("name", "value"), sorted(BAD_VALUES.items()))
def test_a_bad_variable_stops_every_command(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv(name, value)
    assert main(["decline", "0x03010000"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"smcr decline: {name}={value!r} is not allowed: expected "), line


def test_the_library_refuses_a_bad_variable_when_the_runtime_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from smcr.stack import runtime  # noqa: PLC0415

    runtime.close_stacks()
    monkeypatch.setenv("SMCR_SPIN_US", "-5")
    with pytest.raises(settings.SettingError, match="SMCR_SPIN_US='-5' is not allowed"):
        runtime.get_stack()


@pytest.mark.parametrize(("args", "env"), [
    (["bench", "--sizes", "0"], {}),
    (["bench", "--conns", "abc"], {}),
    (["chk", "-S", "-p", "99999"], {}),
    (["chk"], {"SMCR_RNIC": "bogus"}),
    (["demo"], {"SMCR_MAX_LINKS": "7"}),
])  # fmt: skip
def test_no_traceback_from_the_command(args: list[str], env: dict[str, str]) -> None:
    res = subprocess.run([sys.executable, "-m", "smcr", *args], env={**os.environ, **env},
                         cwd=ROOT, capture_output=True, text=True, timeout=60,
                         check=False)  # fmt: skip
    assert res.returncode == 2
    _one_line(res.stderr)
    assert res.stdout == ""


def test_every_variable_the_sources_name_is_registered() -> None:
    """A variable read anywhere in smcr is in :data:`smcr.settings.VARIABLES` (its check and
    its line in the documentation come from there)."""
    import re  # noqa: PLC0415

    named = set()
    for path in (ROOT / "src" / "smcr").rglob("*.py"):
        named |= set(re.findall(r'"(SMCR_[A-Z_]+|SMC_RCVBUF|SMC_SNDBUF)"', path.read_text()))
    named -= {"SMCR_RMBE_SIZES"}  # (a constant of smcr.wire.clc named after Linux's)
    assert named == {var.name for var in settings.VARIABLES}
