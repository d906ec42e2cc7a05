"""``smcr bench --plot FILE``: SMC-R against TCP by message size, as an SVG picture.

Two panels: throughput by write size (higher is better) and round-trip latency
by message size (lower is better); each point is the median of the repetitions,
its bar the lowest and highest run.  Plain SVG written here, no plotting library:
the picture is a few lines and rects, and smcr's dependencies stay two.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from html import escape
from pathlib import Path

from smcr.tools.bench import BenchResult

WIDTH, HEIGHT = 880, 360
PANEL_W, PANEL_H = 360, 240
COLORS = {"SMC-R": "#1f6fb4", "TCP": "#8c8c8c"}


def size_label(size: int) -> str:
    """``1024`` -> ``1 KiB``; ``32`` -> ``32 B``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def _nice_top(value: float) -> float:
    """The axis top: 1, 2 or 5 times a power of ten, at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1.0, 2.0, 5.0, 10.0) if step * power >= value)


def _panel(results: Sequence[BenchResult], x0: float, title: str, unit: str) -> list[str]:
    """One panel: an axis with four grid lines, a line and whiskers per transport."""
    top = _nice_top(max([*(r.smc for r in results), *(r.tcp for r in results),
                         *(v for r in results for v in r.smc_runs + r.tcp_runs)]))  # fmt: skip
    y0 = 60 + PANEL_H
    mid = 60 + PANEL_H / 2
    out = [f'<text x="{x0 + PANEL_W / 2}" y="40" text-anchor="middle" '
           f'font-weight="bold">{escape(title)}</text>',
           f'<text x="{x0 - 48}" y="{mid}" text-anchor="middle" '
           f'transform="rotate(-90 {x0 - 48} {mid})">{escape(unit)}</text>']  # fmt: skip
    for i in range(5):
        grid = y0 - PANEL_H * i / 4
        out.append(f'<line x1="{x0}" y1="{grid:.1f}" x2="{x0 + PANEL_W}" y2="{grid:.1f}" '
                   f'stroke="#ddd"/>')  # fmt: skip
        out.append(f'<text x="{x0 - 6}" y="{grid + 4:.1f}" text-anchor="end">'
                   f"{top * i / 4:g}</text>")
    step = PANEL_W / max(len(results), 1)

    def x(i: int) -> float:
        return x0 + step * (i + 0.5)

    def y(v: float) -> float:
        return y0 - PANEL_H * v / top

    for i, r in enumerate(results):
        out.append(f'<text x="{x(i):.1f}" y="{y0 + 18}" text-anchor="middle">'
                   f"{size_label(r.size)}</text>")
    for name, median, runs in (("SMC-R", "smc", "smc_runs"), ("TCP", "tcp", "tcp_runs")):
        color = COLORS[name]
        points = " ".join(f"{x(i):.1f},{y(getattr(r, median)):.1f}"
                          for i, r in enumerate(results))  # fmt: skip
        out.append(f'<polyline points="{points}" fill="none" stroke="{color}" '
                   f'stroke-width="2"/>')  # fmt: skip
        for i, r in enumerate(results):
            values = getattr(r, runs) or [getattr(r, median)]
            out.append(f'<line x1="{x(i):.1f}" y1="{y(min(values)):.1f}" x2="{x(i):.1f}" '
                       f'y2="{y(max(values)):.1f}" stroke="{color}"/>')  # fmt: skip
            out.append(f'<circle cx="{x(i):.1f}" cy="{y(getattr(r, median)):.1f}" r="3.5" '
                       f'fill="{color}"><title>{name} {size_label(r.size)}: '
                       f"{getattr(r, median):.1f} {escape(unit)}</title></circle>")
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0 + PANEL_W}" y2="{y0}" stroke="#333"/>')
    return out


def svg(results: Sequence[BenchResult], title: str) -> str:
    """The picture of ``results`` (those of ``smcr bench``) as an SVG document."""
    throughput = [r for r in results if r.test == "throughput"]
    latency = [r for r in results if r.test == "latency"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
             f"<title>{escape(title)}</title>",
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
             f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="13">'
             f"{escape(title)}</text>"]  # fmt: skip
    if throughput:
        parts += _panel(throughput, 80, "Throughput by write size (higher is better)", "MB/s")
    if latency:
        parts += _panel(latency, 80 + PANEL_W + 80 if throughput else 80,
                        "Round trip by message size (lower is better)", "µs")  # fmt: skip
    legend_y = HEIGHT - 14
    for i, (name, color) in enumerate(COLORS.items()):
        lx = WIDTH / 2 - 80 + i * 100
        parts.append(f'<rect x="{lx}" y="{legend_y - 9}" width="14" height="10" '
                     f'fill="{color}"/>')  # fmt: skip
        parts.append(f'<text x="{lx + 20}" y="{legend_y}">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def from_json(text: str) -> list[BenchResult]:
    """Results as ``smcr bench --json`` printed them."""
    fields = set(BenchResult.__dataclass_fields__)
    rows = json.loads(text)  # (each row with the run's conditions too: load, cpus)
    return [BenchResult(**{k: v for k, v in row.items() if k in fields}) for row in rows]


def write(path: Path, results: Sequence[BenchResult], title: str) -> None:
    """Write the picture to ``path``."""
    path.write_text(svg(results, title), encoding="utf-8")


__all__ = ["from_json", "size_label", "svg", "write"]
