"""Draws docs/architecture.svg: smcr's layers and rooms, and the path of one ``sendall``.

Run ``python docs/draw_architecture.py`` after the house changes; it writes the SVG beside
itself (no dependencies: the SVG is text).
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

LAYERS = [  # (layer, package, rooms), top down
    ("tools", "smcr.cli, smcr.tools", ["cli", "ss / stats / linkgroup / top", "bench", "demo",
                                       "trace", "chk / info / device"]),
    ("transparent", "smcr.run", ["install (sitecustomize)", "launcher", "tls"]),
    ("socket", "smcr.socket", ["api", "handshake", "connecting", "acceptq",
                               "sharing", "numbers", "fork", "messages", "base"]),
    ("diagnostics", "smcr.diag", ["server", "snapshot", "trace", "registry", "client"]),
    ("runtime", "smcr.stack", ["conn", "executor", "runtime", "progress", "closing",
                               "qps", "wrslots", "bufpool", "clcwatch", "wakeup",
                               "readiness", "ports"]),
    ("discovery", "smcr.discovery", ["bpf (TCP option)", "policy"]),
    ("engine (sans-IO)", "smcr.core", ["Engine (facade)", "clc", "llc", "addlink", "failover",
                                       "ports", "rkeys", "connection", "close", "state"]),
    ("verbs", "smcr.rdma", ["verbs model", "shm RNIC", "RoCEv2 RNIC (+ C loops)"]),
    ("wire", "smcr.wire", ["CLC", "LLC v1/v2", "CDC", "RoCEv2", "TCP option"]),
]
PATH = {"api", "conn", "executor", "shm RNIC", "CDC", "connection"}
"""The rooms one ``sendall`` passes through."""

W, ROW, PAD, LEFT = 1000, 70, 10, 170


def box(x: float, y: float, w: float, h: float, fill: str, text: str, bold: bool = False,
        size: int = 12) -> str:
    weight = "bold" if bold else "normal"
    return (f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="6" fill="{fill}" '
            f'stroke="#445" stroke-width="1"/>'
            f'<text x="{x + w / 2}" y="{y + h / 2 + 4}" font-size="{size}" '
            f'text-anchor="middle" font-family="sans-serif" font-weight="{weight}">'
            f"{escape(text)}</text>")


def main() -> None:
    parts = []
    height = PAD + len(LAYERS) * (ROW + PAD) + 60
    parts.append(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
                 f'viewBox="0 0 {W} {height}">')
    parts.append('<rect width="100%" height="100%" fill="white"/>')
    centers: dict[str, tuple[float, float]] = {}
    for i, (layer, package, rooms) in enumerate(LAYERS):
        y = PAD + i * (ROW + PAD)
        parts.append(box(PAD, y, LEFT - 2 * PAD, ROW, "#dde4f0", layer, bold=True, size=13))
        parts.append(f'<text x="{PAD + 6}" y="{y + ROW - 6}" font-size="10" '
                     f'font-family="monospace" fill="#334">{escape(package)}</text>')
        width = (W - LEFT - PAD) / len(rooms)
        for j, room in enumerate(rooms):
            x = LEFT + j * width
            fill = "#ffe2b8" if room in PATH else "#f4f6f9"
            parts.append(box(x + 3, y + 12, width - 6, ROW - 24, fill, room,
                             size=11 if len(room) < 22 else 9))
            centers[room] = (x + width / 2, y + ROW / 2)
    steps = [("api", "conn"), ("conn", "connection"), ("connection", "CDC"),
             ("conn", "executor"), ("executor", "shm RNIC")]
    for n, (a, b) in enumerate(steps, 1):
        (x1, y1), (x2, y2) = centers[a], centers[b]
        if y1 == y2:  # neighbours in a row: side to side
            ya, yb, x1, x2 = y1, y2, x1 + 16, x2 - 30
        else:
            ya, yb = y1 + 12, y2 - 14
            x1 += 8 if x2 > x1 else -8 if x2 < x1 else 0
        parts.append(f'<line x1="{x1}" y1="{ya}" x2="{x2}" y2="{yb}" '
                     f'stroke="#c05a00" stroke-width="2" marker-end="url(#arrow)"/>')
        mx, my = (x1 + x2) / 2, (ya + yb) / 2 - (12 if y1 == y2 else 0)
        parts.append(f'<circle cx="{mx}" cy="{my}" r="9" fill="#c05a00"/>'
                     f'<text x="{mx}" y="{my + 4}" font-size="11" text-anchor="middle" '
                     f'font-family="sans-serif" fill="white">{n}</text>')
    parts.insert(2, '<defs><marker id="arrow" markerWidth="10" markerHeight="8" refX="9" '
                    'refY="4" orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="#c05a00"/>'
                    "</marker></defs>")
    y = PAD + len(LAYERS) * (ROW + PAD) + 20
    parts.append(f'<text x="{PAD}" y="{y}" font-size="12" font-family="sans-serif">'
                 "Each layer imports only the layers below it (tests/test_layers.py).</text>")
    parts.append(f'<text x="{PAD}" y="{y + 18}" font-size="12" font-family="sans-serif">'
                 "Orange, one sendall over shm: (1) the socket's calls, (2) cursors and (3) "
                 "the CDC, (4) the executor posts (5) the inline WRITE and CDC.</text>")
    parts.append("</svg>")
    Path(__file__).with_name("architecture.svg").write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
