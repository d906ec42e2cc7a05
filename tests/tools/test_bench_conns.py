"""``smcr bench --conns N`` (issue 29): N connections at once, SMC-R against TCP."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from smcr.stack.trim import LOOK_EVERY
from smcr.tools import benchcli, benchconns, connsclient
from smcr.tools.connsclient import ConnsRun, request
from smcr.tools.connsserver import Side, raise_nofile


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "smcr", "bench", *args], capture_output=True,
                          text=True, timeout=180, check=False)  # fmt: skip


def test_conns_json_every_connection_smcr_and_plausible_figures() -> None:
    got = _bench("--conns", "40", "--exchanges", "10", "--reps", "1", "--json")
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stderr
    report = json.loads(got.stdout)
    assert report["test"] == "conns" and report["conns"] == 40 and report["exchanges"] == 10
    assert report["message_size"] == 100 and report["reps"] == 1 and report["rnic"] == "shm"
    assert report["ok"] is True
    assert report["fallbacks"] == {} and report["errors"] == {} and report["failures"] == []
    assert report["smcr_connections"] == report["smc_run_connections"] == 40
    figures = {r["metric"]: r for r in report["results"]}
    assert list(figures) == [key for key, *_ in benchconns.METRICS]
    for r in figures.values():
        assert r["smc_runs"] == [r["smc"]] and r["tcp_runs"] == [r["tcp"]]  # one rep
    for kind in ("smc", "tcp"):
        assert figures["connect_s"][kind] > 0
        assert figures["tx_per_s"][kind] > 0
        assert figures["fds_per_conn_client"][kind] >= 1  # (the TCP socket at least)
        assert figures["fds_per_conn_server"][kind] >= 1
        # each process spent CPU on the exchanges: some, and not more than every CPU of
        # the host for the phase's wall time per transaction (twice: the server's window
        # runs from the client's word to start to its word that the phase ended)
        most = 2 * (os.cpu_count() or 1) * 1e6 / figures["tx_per_s"][kind]
        for side in ("client", "server"):
            cpu = figures[f"cpu_us_per_tx_{side}"][kind]
            assert 0 < cpu < most, (side, kind, cpu, most)
    # an SMC-R connection holds more than its TCP socket: readiness, buffers
    assert figures["fds_per_conn_client"]["smc"] > figures["fds_per_conn_client"]["tcp"]
    assert figures["rss_kib_per_conn_client"]["smc"] > 0
    runs = report["runs"]
    assert [r["kind"] for r in runs] == ["smc", "tcp"]
    for r in runs:
        assert r["opened"] == 40 and r["error_count"] == 0 and r["failure"] == ""
    assert runs[0]["smcr"] == runs[0]["server_smcr"] == 40
    assert runs[1]["smcr"] == runs[1]["server_smcr"] == 0


def test_conns_table() -> None:
    got = _bench("--conns", "20", "--exchanges", "5", "--reps", "1")
    assert got.returncode == 0, got.stderr
    out = " ".join(got.stdout.split())
    assert "20 connections at once, 5 exchanges of 100 B each" in out
    for label in ("connect, all at once", "transactions", "RSS per connection, client",
                  "RSS per connection, server", "descriptors per connection, client",
                  "descriptors per connection, server", "RSS per conn. once idle, client",
                  "RSS per conn. once idle, server", "memory kept after close, client",
                  "memory kept after close, server"):  # fmt: skip
        assert label in out
    assert "SMC-R runs: all 20 connections in SMC-R mode" in out
    assert "errors: none" in out


def _few_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (120, 120))


ONE_TCP_RUN = """
import json, sys
from dataclasses import asdict
from smcr.tools import benchconns
if __name__ == "__main__":
    print(json.dumps(asdict(benchconns.one_run("tcp", 300, 2))))
"""


def test_a_run_that_cannot_open_n_says_how_far_it_got(tmp_path: Path) -> None:
    """EMFILE (a hard limit below what N needs): how many opened and why, no traceback.
    (A TCP run: an SMC-R run ends the same way at 3 descriptors a connection, but its
    server's accept keeps failing and it measures only after ``STALL / 2`` quiet
    seconds, 30; see the README.)"""
    script = tmp_path / "one_run.py"
    script.write_text(ONE_TCP_RUN)
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=False, preexec_fn=_few_descriptors)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert "Traceback" not in got.stderr
    run = ConnsRun.from_dict(json.loads(got.stdout))
    assert 0 < run.opened < 300 and run.tx_per_s == 0.0
    assert run.failure.startswith(f"opened {run.opened} of 300: connection {run.opened + 1}: "
                                  "[Errno 24] Too many open files"), run.failure
    report = benchconns.summarize(300, 2, 1, [run])
    assert report.failures == [f"TCP run 1: {run.failure}"] and not report.ok
    assert all(r.tcp == 0.0 and r.tcp_runs for r in report.results)  # (not in the median)


FOOTPRINT_AT_THE_LIMIT = """
import os
from smcr.tools.connsserver import footprint, keep_spare
keep_spare()
held = []
while True:
    try:
        held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        assert exc.errno == 24, exc
        break
first, second = footprint(), footprint()
assert first.fds == second.fds > len(held) > 50, (first, len(held))
assert first.rss_kib > 0
print("ok")
"""


def test_the_footprint_is_read_with_every_other_descriptor_taken(tmp_path: Path) -> None:
    """A run at the process's limit (every descriptor taken by connections) still
    measures itself: two descriptors held back for it, not counted, held again after."""
    script = tmp_path / "footprint.py"
    script.write_text(FOOTPRINT_AT_THE_LIMIT)
    got = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, check=False, preexec_fn=_few_descriptors)  # fmt: skip
    assert (got.returncode, got.stdout.strip()) == (0, "ok"), got.stderr


def test_raise_nofile_takes_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        assert raise_nofile() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_requests_differ_by_connection_and_exchange() -> None:
    assert len(request(3, 7)) == 100
    assert len({request(i, k) for i in range(3) for k in range(3)}) == 9


def _run(kind: str, connect_s: float, *, fallbacks: dict[str, int] | None = None,
         errors: dict[str, int] | None = None, failure: str = "") -> ConnsRun:
    opened = 4 if failure else 10
    smcr = opened - sum((fallbacks or {}).values()) if kind == "smc" else 0
    client = Side(8.0, 3.0, 9.0, kept_mib=1.5, cpu_us_per_tx=40.0)
    server = Side(6.0, 2.0, 7.0, kept_mib=0.5, cpu_us_per_tx=30.0)
    return ConnsRun(kind, 10, opened=opened, connect_s=connect_s,
                    tx_per_s=1000 * connect_s, client=client, server=server, smcr=smcr,
                    fallbacks=fallbacks or {}, errors=errors or {},
                    failure=failure)  # fmt: skip


def _args(**extra: object) -> argparse.Namespace:
    return argparse.Namespace(**{"conns": 10, "exchanges": 3, "reps": 3, "json": False,
                                 "plot": None, "rnic": "shm", "netns": False, "load": 0,
                                 "cpus": None, "bufsize": 0, **extra})  # fmt: skip


def test_medians_leave_failed_runs_out_and_fallbacks_show(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Scripted runs (no processes): SMC-R and TCP alternate, the medians are of the runs
    that opened N, and a fallback, an error or a failed run is printed and gives 1."""
    script = iter([
        _run("smc", 2.0), _run("tcp", 1.0),
        _run("smc", 4.0, fallbacks={"TCP 0x03010000/0x00000000": 2}), _run("tcp", 3.0),
        _run("smc", 9.0, failure="opened 4 of 10: connection 5: [Errno 24] Too many "
             "open files"),
        _run("tcp", 2.0, errors={"wrong bytes in a response": 1, "recv: [bold] x": 1}),
    ])  # fmt: skip
    kinds: list[str] = []

    def one_run(kind: str, *args: object) -> ConnsRun:
        kinds.append(kind)
        return next(script)

    monkeypatch.setattr(benchconns, "one_run", one_run)
    console = Console(record=True, width=200)
    assert benchcli.run(_args(), console) == 1
    assert kinds == ["smc", "tcp"] * 3
    text = console.export_text()
    row = next(line for line in text.splitlines() if "connect, all at once" in line)
    # SMC-R: the median of 2 and 4 (9: the failed run); TCP: of 1, 3, 2
    assert [cell.strip() for cell in row.split("│")[2:5]] == ["3", "2", "s"], row
    assert "FALLBACK: 2 of 24 connections of the SMC-R runs fell back to TCP: " \
           "TCP 0x03010000/0x00000000 x2" in text
    assert "ERRORS (2): wrong bytes in a response x1; recv: [bold] x x1" in text  # (not markup)
    assert "FAILED: SMC-R run 3: opened 4 of 10: connection 5: [Errno 24]" in text


def test_json_of_a_clean_report(monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    script = iter([_run("smc", 2.0), _run("tcp", 1.0)])
    monkeypatch.setattr(benchconns, "one_run", lambda *a: next(script))
    assert benchcli.run(_args(reps=1, json=True), Console()) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["load"] == 0 and report["cpus"] is None
    connect = report["results"][0]
    assert (connect["metric"], connect["unit"], connect["smc"], connect["tcp"],
            connect["ratio"]) == ("connect_s", "s", 2.0, 1.0, 2.0)  # fmt: skip
    kept = {r["metric"]: r for r in report["results"]}["kept_mib_server"]
    assert kept["smc"] == kept["tcp"] == 0.5
    assert report["runs"][0]["client"] == {"rss_kib_per_conn": 8.0, "fds_per_conn": 3.0,
                                           "rss_kib_per_conn_used": 9.0,
                                           "rss_kib_per_conn_idle": 0.0, "kept_mib": 1.5,
                                           "cpu_us_per_tx": 40.0}
    cpu = {r["metric"]: r for r in report["results"]}["cpu_us_per_tx_server"]
    assert (cpu["label"], cpu["unit"], cpu["smc"]) == ("CPU per transaction, server", "us", 30.0)


def test_without_conns_the_bench_is_the_size_sweep() -> None:
    from smcr.cli import build_parser  # noqa: PLC0415

    args = build_parser().parse_args(["bench"])
    assert args.conns is None and args.exchanges == benchconns.EXCHANGES


def test_the_idle_reading_waits_for_the_runtimes_give_back() -> None:
    """An SMC-R run reads the RSS of idle connections after they have given back what their
    traffic touched: within twice the runtime's idle time (:mod:`smcr.stack.trim`)."""
    assert connsclient.IDLE_WAIT > 2 * LOOK_EVERY
