"""Draws docs/first-contact.svg: the messages of an SMC-R first contact, client and server.

Run ``python docs/draw_first_contact.py`` after the handshake changes; it writes the SVG
beside itself (no dependencies: the SVG is text).  tests/test_docs.py checks that the
picture in the repository is what this script draws.
"""

from __future__ import annotations

from pathlib import Path
from xml.sax.saxutils import escape

# (from, label, detail, path): "c" client to server, "s" server to client, "" a note.
STEPS = [
    ("c", "SYN + SMC option", "TCP option kind 254, ExID 0xE2D4C3D9", "tcp"),
    ("s", "SYN-ACK + SMC option", "both offered SMC: the CLC handshake may start", "tcp"),
    ("c", "ACK", "", "tcp"),
    ("c", "CLC Proposal", "GID, MAC, IP prefix (v2: UEIDs)", "clc"),
    ("s", "CLC Accept (first contact)", "server's QP number, RMB rkey and size", "clc"),
    ("", "RC queue pairs up: the client's now, the server's at the Confirm", "", ""),
    ("c", "CLC Confirm", "client's QP number, RMB rkey and size", "clc"),
    ("s", "LLC CONFIRM LINK request", "over the new link: the link is usable", "llc"),
    ("c", "LLC CONFIRM LINK response", "link group up (v2.1 with 2 links: ADD LINK)", "llc"),
    ("", "the TCP connection stays open, idle; the application's bytes go by RDMA", "", ""),
    ("c", "RDMA WRITE into the server's RMB", "sendall()'s bytes, placed by the RNIC", "rdma"),
    ("c", "CDC (producer cursor)", "a SEND: 'n more bytes are there'", "llc"),
    ("s", "CDC (consumer cursor)", "the reader freed room: the writer may go on", "llc"),
]
COLORS = {"tcp": "#6c757d", "clc": "#b35806", "llc": "#1f6fb4", "rdma": "#2b8a3e"}
LEGEND = [("tcp", "TCP (kernel)"), ("clc", "CLC over TCP"),
          ("llc", "LLC / CDC: RDMA SEND"), ("rdma", "RDMA WRITE")]  # fmt: skip
WIDTH, LEFT, RIGHT, TOP, STEP = 760, 170, 590, 70, 40


def _text(x: float, y: float, text: str, **attrs: str) -> str:
    extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:.0f}" y="{y:.0f}"{extra}>{escape(text)}</text>'


def svg() -> str:
    """The picture, as SVG text."""
    height = TOP + STEP * len(STEPS) + 60
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">',
           "<title>SMC-R first contact: TCP, CLC, LLC and data</title>",
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
           'fill="context-stroke"/></marker></defs>']  # fmt: skip
    for x, name in ((LEFT, "client (smcr.create_connection)"),
                    (RIGHT, "server (smcr.create_server)")):  # fmt: skip
        out.append(_text(x, 30, name, text_anchor="middle", font_weight="bold"))
        out.append(f'<line x1="{x}" y1="42" x2="{x}" y2="{height - 50}" stroke="#999" '
                   'stroke-dasharray="4 3"/>')  # fmt: skip
    for i, (side, label, detail, path) in enumerate(STEPS):
        y = TOP + STEP * i
        if not side:
            out.append(f'<rect x="{LEFT - 40}" y="{y - 14}" width="{RIGHT - LEFT + 80}" '
                       'height="22" fill="#f3f3f3" rx="4"/>')  # fmt: skip
            out.append(_text((LEFT + RIGHT) / 2, y + 2, label, text_anchor="middle",
                             font_style="italic"))  # fmt: skip
            continue
        start, end = (LEFT, RIGHT) if side == "c" else (RIGHT, LEFT)
        color = COLORS[path]
        out.append(f'<line x1="{start}" y1="{y}" x2="{end}" y2="{y}" stroke="{color}" '
                   'stroke-width="2" marker-end="url(#arrow)"/>')  # fmt: skip
        out.append(_text((LEFT + RIGHT) / 2, y - 6, label, text_anchor="middle", fill=color,
                         font_weight="bold"))  # fmt: skip
        if detail:
            out.append(_text((LEFT + RIGHT) / 2, y + 14, detail, text_anchor="middle",
                             fill="#444", font_size="11"))  # fmt: skip
    for i, (path, name) in enumerate(LEGEND):
        x = 40 + i * 180
        out.append(f'<rect x="{x}" y="{height - 30}" width="14" height="10" '
                   f'fill="{COLORS[path]}"/>')  # fmt: skip
        out.append(_text(x + 20, height - 21, name))
    out.append("</svg>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    Path(__file__).with_name("first-contact.svg").write_text(svg())
