"""``smcr bench`` and ``smcr demo`` (the end-to-end SMC-R demo) run and report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from smcr.tools import bench, demo


def test_bench_json_smoke(tmp_path: Path) -> None:
    plot = tmp_path / "bench.svg"
    result = subprocess.run(
        [sys.executable, "-m", "smcr", "bench", "--json", "--reps", "1", "--sizes", "4096",
         "--volume", "1", "--rounds", "20", "--connections", "20", "--plot", str(plot)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["test"], r["size"]) for r in rows] == [
        ("throughput", 4096), ("latency", 32), ("latency", 1024), ("event loop", 32),
        ("connect", 1), ("connect to plain", 1)]
    for r in rows:
        assert r["smc"] > 0 and r["tcp"] > 0
        assert r["unit"] == ("MB/s" if r["test"] == "throughput" else "us")
        assert r["smc_runs"] == [r["smc"]] and r["tcp_runs"] == [r["tcp"]]  # one rep: no median
        assert r["smc_cpu"] > 0 and r["tcp_cpu"] > 0
    assert plot.read_text().count("<polyline") == 4  # (--plot: both transports, both panels)


class ScriptedBench:
    """Stands in for :class:`smcr.tools.bench.Bench`: each call returns the next scripted
    figure, so the test knows what ``run`` must report."""

    figures: ClassVar[dict[str, Iterator[float]]] = {}  # set by the test
    closed: ClassVar[bool] = False

    def __init__(self, bufsize: int, host: str, peer_netns: str | None) -> None:
        pass

    def throughput(self, kind: str, size: int, volume: int) -> tuple[float, float]:
        return next(self.figures[kind]) * 1e6, 7.0  # bytes/s: run reports MB/s

    def pingpong(self, kind: str, size: int, rounds: int) -> tuple[float, float]:
        return next(self.figures[kind]), 7.0

    def event_loop_pingpong(self, kind: str, size: int, rounds: int) -> tuple[float, float]:
        return next(self.figures[kind]), 7.0

    def close(self) -> None:
        ScriptedBench.closed = True


def test_bench_reports_medians_and_smc_over_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "Bench", ScriptedBench)
    monkeypatch.setattr(ScriptedBench, "closed", False)
    monkeypatch.setattr(ScriptedBench, "figures", {
        "smc": iter([9.0, 1.0, 5.0, 40.0, 10.0, 20.0, 3.0, 3.0, 3.0, 50.0, 70.0, 60.0]),
        "tcp": iter([2.0, 4.0, 3.0, 8.0, 8.0, 8.0, 1.0, 2.0, 6.0, 20.0, 10.0, 30.0])})  # fmt: skip
    labels: list[str] = []
    results = bench.run([4096], reps=3, volume=1 << 20, rounds=10, progress=labels.append)
    assert ScriptedBench.closed
    assert [(r.test, r.size, r.unit) for r in results] == [
        ("throughput", 4096, "MB/s"), ("latency", 32, "us"), ("latency", 1024, "us"),
        ("event loop", 32, "us")]
    # SMC and TCP alternate within each repetition; the figure is the median of three
    assert [(r.smc_runs, r.tcp_runs) for r in results] == [
        ([9.0, 1.0, 5.0], [2.0, 4.0, 3.0]), ([40.0, 10.0, 20.0], [8.0, 8.0, 8.0]),
        ([3.0, 3.0, 3.0], [1.0, 2.0, 6.0]), ([50.0, 70.0, 60.0], [20.0, 10.0, 30.0])]  # fmt: skip
    assert [(r.smc, r.tcp, r.ratio) for r in results] == [
        (5.0, 3.0, 5.0 / 3.0), (20.0, 8.0, 2.5), (3.0, 2.0, 1.5), (60.0, 20.0, 3.0)]
    assert labels[:2] == ["throughput 4096 B smc #1", "throughput 4096 B tcp #1"]
    assert len(labels) == 4 * 3 * 2
    rows = json.loads(bench.to_json(results))
    assert [(r["smc"], r["tcp"], r["ratio"]) for r in rows] == [
        (5.0, 3.0, 5.0 / 3.0), (20.0, 8.0, 2.5), (3.0, 2.0, 1.5), (60.0, 20.0, 3.0)]
    assert bench.BenchResult("latency", 32, "us", 1.0, 0.0).ratio == 0.0  # no TCP figure


@pytest.mark.slow
@pytest.mark.parametrize(("rnic", "device"), [("shm", "smcr"), ("roce", "roce_lo")])
def test_demo_runs_smcr_end_to_end(rnic: str, device: str) -> None:
    """The demo names the RNIC it ran over, and the server sees its link group."""
    result = subprocess.run(
        [sys.executable, "-m", "smcr", "demo"],
        env={**os.environ, "SMCR_RNIC": rnic, "COLUMNS": "200"},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "SMCR" in out and "LINK_ACTIVE" in out
    assert "SMC-R / TCP throughput" in out
    assert f"over the {rnic} RNIC" in out and f"SMC-R ({rnic} RNIC)" in out
    assert f"{device}" in out and f"({demo.rnic_label(rnic)})" in out
    other = "roce" if rnic == "shm" else "shm"
    assert f"{other} RNIC" not in out and demo.rnic_label(other) not in out
    assert "link groups [(1, 'SERV', 'SINGLE', 1)]" in out


def test_info_reports_the_buffers_and_links_smcr_uses() -> None:
    """``smcr info`` gives the buffer sizes a connection really gets on each RNIC kind and
    the links per group as configured (not only the engine's Linux defaults)."""
    from smcr.core import Config  # noqa: PLC0415
    from smcr.stack.runtime import BUFFER, ROCE_BUFFER, VERBS_BUFFER  # noqa: PLC0415

    got = subprocess.run([sys.executable, "-m", "smcr", "info", "--json"], capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    info = json.loads(got.stdout)
    assert info["buffers"] == {"shm": BUFFER, "roce": ROCE_BUFFER, "verbs": VERBS_BUFFER}
    assert info["limits"]["max_links_v2"] == 1 and info["limits"]["testlink_time"] == 30
    assert info["link_rnics"] == "1 shm RNIC (SMCR_SHM_RNICS)"
    assert info["limits"]["max_conns"] == Config().max_conns == 255
    text = subprocess.run([sys.executable, "-m", "smcr", "info"], capture_output=True, text=True,
                          timeout=60, check=True).stdout  # fmt: skip
    assert (f"send buffer and RMB {BUFFER >> 10} KiB on shm, {ROCE_BUFFER >> 10} KiB on roce, "
            f"{VERBS_BUFFER >> 10} KiB on verbs") in text
    assert "255 connections per link group\n" in text
    assert "up to 1 per link group offered in SMC-Rv2.1 (SMCR_MAX_LINKS)" in text
    configured = {**os.environ, "SMCR_MAX_LINKS": "2", "SMCR_SHM_RNICS": "2",
                  "SMCR_TESTLINK_TIME": "5"}
    text = subprocess.run([sys.executable, "-m", "smcr", "info"], capture_output=True, text=True,
                          timeout=60, check=True, env=configured).stdout  # fmt: skip
    assert "up to 2 per link group offered in SMC-Rv2.1 (SMCR_MAX_LINKS)" in text
    assert "on 2 shm RNICs (SMCR_SHM_RNICS)" in text and "TEST LINK every 5.0 s" in text


def test_demo_in_process_with_a_small_volume(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's whole path (discovery line, connection details, the transfers in both
    write sizes, the table) in the fast suite: 1 MiB instead of 256; the slow test above
    runs the real one."""
    from rich.console import Console  # noqa: PLC0415

    monkeypatch.setattr(demo, "VOLUME", 1 << 20)
    console = Console(record=True, width=160)
    assert demo.run(console) == 0
    text = console.export_text()
    assert "SMCR" in text and "LINK_ACTIVE" in text
    assert "accepted in mode SMCR" in text
    flat = " ".join(text.split())  # (the table's title wraps to its width)
    assert "1 MiB each, timed until the receiver has it all, SHA-256 checked" in flat
    rows = [line for line in text.splitlines()
            if "SMC-R (shm RNIC)" in line or "TCP loopback" in line]  # fmt: skip
    assert len(rows) == 4 and all(row.rstrip(" │").endswith("True") for row in rows), rows
    assert [row.split("│")[1].strip() for row in rows] == ["64 KiB"] * 2 + ["1 MiB"] * 2
    assert re.search(r"SMC-R / TCP throughput: [\d.]+x in 64 KiB writes, [\d.]+x in 1 MiB "
                     r"writes", text), text
