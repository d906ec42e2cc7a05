"""``smcr bench --plot``: the picture of the results (smcr.tools.benchplot)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from smcr.tools import bench, benchplot
from smcr.tools.bench import BenchResult

SVG = "{http://www.w3.org/2000/svg}"


def _results() -> list[BenchResult]:
    out = [BenchResult("throughput", size, "MB/s", 900.0 + i, 700.0, [880.0, 900.0, 950.0],
                       [690.0, 700.0, 720.0], 3.0, 4.0)
           for i, size in enumerate(bench.SIZES)]  # fmt: skip
    out += [BenchResult("latency", size, "us", 20.0, 30.0, [19.0, 21.0], [29.0, 33.0])
            for size in bench.PING_SIZES]  # fmt: skip
    out.append(BenchResult("connect", 1, "us", 300.0, 100.0))  # (not drawn)
    return out


def test_the_picture_has_both_transports_in_both_panels(tmp_path: Path) -> None:
    path = tmp_path / "bench.svg"
    benchplot.write(path, _results(), "SMC-R <shm> vs TCP & more")
    root = ET.parse(path).getroot()  # well-formed, the title's markup escaped
    assert root.tag == f"{SVG}svg"
    lines = root.findall(f"{SVG}polyline")
    assert [line.get("stroke") for line in lines] == [benchplot.COLORS["SMC-R"],
                                                      benchplot.COLORS["TCP"]] * 2
    assert [len(line.get("points", "").split()) for line in lines] == [6, 6, 2, 2]
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "1 MiB" in texts and "32 B" in texts and "SMC-R <shm> vs TCP & more" in texts
    tips = [t.text for t in root.iter(f"{SVG}title")]
    assert "SMC-R 1 KiB: 900.0 MB/s" in tips


def test_results_from_json_draw_the_same() -> None:
    results = _results()
    again = benchplot.from_json(bench.to_json(results, {"load": 2, "cpus": [0]}))
    assert again == results
    assert benchplot.svg(again, "t") == benchplot.svg(results, "t")


def test_sizes_are_labelled_in_binary_units() -> None:
    assert [benchplot.size_label(s) for s in (32, 1000, 1024, 65536, 1 << 20, 1536)] == [
        "32 B", "1000 B", "1 KiB", "64 KiB", "1 MiB", "1536 B"]
