"""Run tshark on a capture and read back what Wireshark decoded.

smcr holds itself to Wireshark's reading of its bytes: the tests and
``smcr demo`` decode captures of smcr's messages with tshark and compare the
fields with what smcr encoded.  :func:`decode` parses tshark's PDML output into
one :class:`DecodedFrame` per frame: every field by its Wireshark name (a field
that occurs several times keeps all values, in order), the protocols seen, and
whether Wireshark flagged the frame malformed.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

#: Expert-info severity of an error in PDML (``PI_ERROR``).
_PI_ERROR = 0x00800000


class TsharkMissingError(RuntimeError):
    """tshark is not installed (``install.sh`` installs it)."""


@dataclass
class DecodedFrame:
    """What Wireshark made of one frame."""

    number: int
    protocols: list[str] = field(default_factory=list)
    fields: dict[str, list[str]] = field(default_factory=dict)
    malformed: bool = False
    errors: list[str] = field(default_factory=list)

    def values(self, name: str) -> list[str]:
        """Every value (tshark's ``show`` text) of field ``name``, in order."""
        return self.fields.get(name, [])

    def first(self, name: str) -> str:
        """The first value of field ``name``; KeyError if Wireshark did not decode it."""
        found = self.fields.get(name)
        if not found:
            raise KeyError(f"frame {self.number}: Wireshark decoded no field {name!r}")
        return found[0]


HEURISTIC_FIRST = ("-o", "tcp.try_heuristic_first:TRUE")
"""tshark options that let SMC's heuristic see a CLC message on any TCP port."""


def tshark_path() -> str:
    """The tshark binary, or :class:`TsharkMissingError`."""
    path = shutil.which("tshark")
    if path is None:
        raise TsharkMissingError("tshark not found; run ./install.sh (Debian package tshark)")
    return path


def decode(pcap: Path, *, timeout: float = 120.0) -> list[DecodedFrame]:
    """Decode ``pcap`` with ``tshark -T pdml``, all dissectors at their defaults but one:
    TCP payloads go to the heuristic dissectors (SMC's CLC among them) before the
    dissector of their port, so a server on a port Wireshark gives to another protocol
    (44818 EtherNet/IP, 48898 ADS, ...) still shows its CLC messages as SMC."""
    result = subprocess.run(
        [tshark_path(), *HEURISTIC_FIRST, "-n", "-r", str(pcap), "-T", "pdml"],
        capture_output=True,
        check=True,
        timeout=timeout,
    )
    root = ET.fromstring(result.stdout)
    return [_frame(number, packet) for number, packet in enumerate(root.iter("packet"), 1)]


def _frame(number: int, packet: ET.Element) -> DecodedFrame:
    frame = DecodedFrame(number)
    for proto in packet.findall("proto"):
        name = proto.get("name", "")
        frame.protocols.append(name)
        if name == "_ws.malformed":
            frame.malformed = True
        for element in proto.iter("field"):
            fname = element.get("name")
            if not fname:
                continue
            show = element.get("show")
            frame.fields.setdefault(fname, []).append(show if show is not None else "")
            if fname == "_ws.expert":
                _expert(frame, element)
    return frame


def _expert(frame: DecodedFrame, expert: ET.Element) -> None:
    """Record an expert-info item of error severity (warnings and notes are not errors)."""
    parts = {child.get("name"): child.get("show") or "" for child in expert.iter("field")}
    if int(parts.get("_ws.expert.severity") or "0") >= _PI_ERROR:
        frame.errors.append(parts.get("_ws.expert.message") or "expert error")


def summary_lines(pcap: Path, *, timeout: float = 60.0) -> list[tuple[str, str]]:
    """(protocol column, info column) per frame, as tshark's one-line summary shows them."""
    result = subprocess.run(
        [tshark_path(), "-n", "-r", str(pcap), "-T", "fields",
         "-e", "_ws.col.Protocol", "-e", "_ws.col.Info"],
        capture_output=True,
        check=True,
        timeout=timeout,
        text=True,
    )
    rows = []
    for line in result.stdout.splitlines():
        proto, _, info = line.partition("\t")
        rows.append((proto, info.strip()))
    return rows
