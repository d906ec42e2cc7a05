"""``smcr demo --capture``: the messages of an SMC-R connection, as Wireshark reads them.

Builds :func:`smcr.sample.sample_conversation` with :mod:`smcr.wire`, decodes
every message back with smcr's own decoders (each must re-encode to the same
bytes), writes the frames to a pcap file and has tshark decode it.  The table
shows, per frame, what smcr built beside what Wireshark says it is.  Exit
status 1 if any frame fails either check.

The capture goes into a fresh private directory (``tempfile.mkdtemp``) unless
``--out`` names a directory; an existing file is never overwritten.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from smcr.pcap import PcapWriter
from smcr.sample import SampleFrame, WireMessage, sample_conversation
from smcr.tools.tshark import TsharkMissingError, decode, summary_lines
from smcr.wire.cdc import CdcMessage
from smcr.wire.clc import decode_clc
from smcr.wire.llc import decode_llc


def _round_trips(item: SampleFrame) -> bool:
    """smcr decodes the message it built and re-encodes the same bytes."""
    if item.message is None:
        return True
    raw = item.message.encode()
    again: WireMessage
    if item.kind == "tcp":
        again = decode_clc(raw)
    elif raw[0] == 0xFE:
        again = CdcMessage.decode(raw)
    else:
        again = decode_llc(raw)
    return again == item.message and again.encode() == raw


_NOISE = re.compile(r"\s*\b(?:Seq|Ack|Win|Len)=\S+|\d+ → \d+ ")


def _short(info: str) -> str:
    """tshark's Info column without the TCP bookkeeping (ports, sequence numbers)."""
    return _NOISE.sub("", info).replace("],", "] ").strip(" ,")


def run(out_dir: Path | None, console: Console) -> int:
    """Build, check, write and decode the sample; print the table; return the exit status."""
    frames = sample_conversation()
    directory = out_dir if out_dir is not None else Path(tempfile.mkdtemp(prefix="smcr-demo-"))
    directory.mkdir(parents=True, exist_ok=True)
    pcap = directory / "smcr-sample.pcap"
    try:
        writer = PcapWriter(pcap)
    except FileExistsError:
        console.print(f"[red]{pcap} exists already; not overwriting it[/red] (use another --out)")
        return 1
    with writer:
        for index, item in enumerate(frames):
            writer.write(item.frame, 1_700_000_000 + index / 1000)
    try:
        decoded = decode(pcap)
        summary = summary_lines(pcap)
    except TsharkMissingError as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    table = Table(title="An SMC-R connection built by smcr.wire, decoded by Wireshark")
    for column in ("#", "smcr built", "round trip", "Wireshark", "Wireshark says"):
        table.add_column(column, overflow="fold")
    failures = 0
    for item, frame, (proto, info) in zip(frames, decoded, summary, strict=True):
        ours = _round_trips(item)
        theirs = not frame.malformed and not frame.errors
        if item.message is not None:
            theirs = theirs and "smc" in frame.protocols
        failures += not (ours and theirs)
        mark = "[green]ok[/green]" if ours else "[red]MISMATCH[/red]"
        table.add_row(str(frame.number), item.note, mark if item.message else "",
                      proto if theirs else f"[red]{proto}[/red]", _short(info))
    console.print(table)
    messages = sum(item.message is not None for item in frames)
    console.print(f"{len(frames)} frames, {messages} SMC messages, written to {pcap}")
    if failures:
        console.print(f"[red]{failures} frame(s) failed[/red]")
        return 1
    console.print("[green]Wireshark recognises every message smcr built.[/green]")
    return 0
