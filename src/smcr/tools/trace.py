"""``smcr trace -w FILE [-p PID]``: a pcap of what smcr processes' SMC-R connections do.

The tool asks each process (``-p``: that one; else every smcr process of this
user) to trace (:mod:`smcr.diag.trace`: hooks installed only while a tool
listens), reads the records each streams, and writes them as frames that
Wireshark decodes as SMC-R (:mod:`smcr.tools.tracepcap`): CLC over TCP, LLC and
CDC as RoCEv2 SENDs, RDMA WRITE headers.  Over the shm RNIC, which has no wire,
this is the only way to see them; over RoCE it is what the process did, without
a capture tool or privileges.

It stops on Ctrl-C (or SIGTERM), after ``--count`` frames or ``--duration``
seconds: it shuts its end of each stream, takes what the processes recorded up
to then and their last frame (each says how many records it dropped because
the tool was slow), and closes the file; a second Ctrl-C stops it at once.  The
file is created exclusively (never through a path someone else made,
design/TOOLS.md); ``-w -`` writes to standard output (for ``| tshark -r -``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smcr.diag import client, protocol
from smcr.pcap import PcapWriter
from smcr.tools.tracepcap import TraceFramer

START_TIMEOUT = 2.0
"""Seconds a process has to answer the trace request."""
END_WAIT = 3.0
"""Seconds the tool waits, once stopping, for each process's last records."""


@dataclass
class Session:
    """One traced process: its stream and what came of it."""

    pid: int
    sock: socket.socket
    command: str = ""
    framer: TraceFramer = field(default_factory=TraceFramer)
    records: int = 0
    dropped: int = 0
    ended: bool = False
    error: str = ""

    def summary(self) -> dict[str, Any]:
        """This process's line in the ``--json`` summary."""
        row = {"pid": self.pid, "command": self.command, "records": self.records,
               "dropped": self.dropped, "bad": self.framer.bad,
               "unframed": self.framer.unframed}  # fmt: skip
        if self.error:
            row["error"] = self.error
        return row


def why_not(pid: int) -> str:
    """Why ``pid`` cannot be traced by this user (it has no endpoint we may see)."""
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return f"pid {pid}: no such process"
    except OSError as exc:
        return f"pid {pid}: {exc.strerror or exc}"
    if owner != os.getuid() and os.getuid() != 0:
        return (f"pid {pid}: not yours (uid {owner}); a user traces their own smcr "
                "processes, root everyone's")
    return (f"pid {pid}: not an smcr process using SMC (it has no diag endpoint: no SMC "
            "socket yet, or SMCR_DIAG=0)")


def _start(ep: client.Endpoint, snap: int) -> Session | str:
    """Ask one process to trace; its session, or why not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(START_TIMEOUT)
        sock.connect(str(ep.path))
        sock.sendall(protocol.encode({"op": "trace", "snap": snap}))
        header = _recv_exactly(sock, protocol.HEADER)
        answer = protocol.decode(_recv_exactly(sock, protocol.frame_length(header, 1 << 20)))
    except (OSError, protocol.ProtocolError, EOFError) as exc:
        sock.close()
        if isinstance(exc, ConnectionRefusedError):
            return f"pid {ep.pid}: stale (process gone)"
        return f"pid {ep.pid}: {client.text(getattr(exc, 'strerror', None) or exc)}"
    if answer.get("ok") is not True or answer.get("pid") != ep.pid:
        sock.close()
        return f"pid {ep.pid}: {client.text(answer.get('error', 'refused'))}"
    sock.settimeout(None)
    proc = answer.get("process")
    command = client.text(proc.get("comm", ""), 40) if isinstance(proc, dict) else ""
    return Session(ep.pid, sock, command)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("closed")
        buf += chunk
    return bytes(buf)


Inbox = queue.SimpleQueue[tuple[Session, dict[str, Any] | None] | None]
"""What the loop takes in turn: a stream's frame, or (session, None) once a stream ends
(or breaks), or None for Ctrl-C or SIGTERM (:class:`_Signals`)."""


def _reader(session: Session, inbox: Inbox) -> None:
    """Frames of one stream into ``inbox``; None once it ends (or breaks)."""
    try:
        while True:
            header = _recv_exactly(session.sock, protocol.HEADER)
            length = protocol.frame_length(header, protocol.MAX_ANSWER)
            frame = protocol.decode(_recv_exactly(session.sock, length))
            inbox.put((session, frame))
            if frame.get("end") is True:
                break
    except EOFError:
        if not (session.ended or session.error):
            session.error = "the process ended the trace (it exited?)"
    except (OSError, protocol.ProtocolError) as exc:
        if not (session.ended or session.error):
            session.error = client.text(getattr(exc, "strerror", None) or exc)
    inbox.put((session, None))


class _Signals:
    """Ctrl-C and SIGTERM while the loop runs.

    The first is a None in the inbox, taken in turn like the frames: the loop
    then stops the proper way (:func:`_stop`) whatever it was doing when the
    signal came.  Raised as KeyboardInterrupt, as Python does with Ctrl-C, it
    ended the loop wherever it landed: amid a frame of records (the rest of it,
    and all the processes still held, never counted nor written; a pcap record
    cut between its header and its frame), with no word to the processes.
    (``SimpleQueue.put`` may be called from a handler, even one that runs inside
    the loop's own ``get``.)  The second signal stops at once: KeyboardInterrupt.
    A SIGINT ignored when the tool started stays so, as Python leaves it (a shell
    starts a script's background jobs so, away from the terminal's Ctrl-C: there
    SIGTERM, ``-c`` or ``--duration`` stop the tool).
    """

    def __init__(self, inbox: Inbox) -> None:
        self.inbox = inbox
        self.seen = 0
        self.old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if _main_thread():  # (handlers can be set, and run, only there)
            for signum in (signal.SIGINT, signal.SIGTERM):
                old = signal.getsignal(signum)
                if old is None or (signum == signal.SIGINT and old == signal.SIG_IGN):
                    continue  # (not set from Python; ignored, as a background job's Ctrl-C)
                self.old[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for signum, old in self.old.items():
            signal.signal(signum, old)

    def _handle(self, _signum: int, _frame: object) -> None:
        self.seen += 1
        if self.seen > 1:
            raise KeyboardInterrupt
        self.inbox.put(None)


class _Output:
    """The pcap being written and the frame budget."""

    def __init__(self, target: str, count: int) -> None:
        self.target = target
        if target == "-":
            self.writer = PcapWriter(sys.stdout.buffer)
        else:
            self.writer = PcapWriter(Path(target))
        self.count = count
        self.full = False

    def write(self, frames: list[tuple[float, bytes]]) -> None:
        for ts, frame in frames:
            if self.full:
                return
            self.writer.write(frame, ts)
            if self.count and self.writer.frames >= self.count:
                self.full = True

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _take(out: _Output, session: Session, frame: dict[str, Any]) -> None:
    records = frame.get("records")
    if isinstance(records, list):
        for record in records:
            session.records += 1
            out.write(session.framer.frames(record))
    dropped = frame.get("dropped")
    if isinstance(dropped, int) and not isinstance(dropped, bool) and dropped >= 0:
        session.dropped = dropped
    if frame.get("end") is True:
        session.ended = True


def _check_args(args: argparse.Namespace) -> str:
    if args.count is not None and args.count < 1:
        return "--count must be at least 1"
    if args.duration is not None and args.duration <= 0:
        return "--duration must be positive"
    if not 0 <= args.snaplen <= 4096:
        return "--snaplen must be 0..4096"
    if args.write == "-" and sys.stdout.isatty():
        return "will not write a pcap to a terminal (-w - | tshark -r -)"
    return ""


def run(args: argparse.Namespace) -> int:
    """``smcr trace``: see the module docstring; 0 when something was traced."""
    problem = _check_args(args)
    if problem:
        print(f"smcr trace: {problem}", file=sys.stderr)
        return 2
    endpoints = client.endpoints()
    if args.pid is not None:
        endpoints = [e for e in endpoints if e.pid == args.pid]
        if not endpoints:
            print(f"smcr trace: {why_not(args.pid)}", file=sys.stderr)
            return 1
    if not endpoints:
        print("smcr trace: no smcr process of yours uses SMC (nothing to trace)",
              file=sys.stderr)
        return 1
    try:
        out = _Output(args.write, args.count or 0)
    except FileExistsError:
        print(f"smcr trace: {args.write}: exists (smcr trace writes only new files)",
              file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"smcr trace: {args.write}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    sessions: list[Session] = []
    refused: list[str] = []
    for ep in endpoints:
        got = _start(ep, args.snaplen)
        if isinstance(got, Session):
            sessions.append(got)
        else:
            refused.append(got)
            print(f"smcr trace: {got}", file=sys.stderr)
    if not sessions:
        out.close()
        if args.write != "-":
            with contextlib.suppress(OSError):
                os.unlink(args.write)
        return 1
    names = ", ".join(f"{s.pid} ({s.command})" for s in sessions)
    print(f"smcr trace: tracing pid {names}; writing {args.write}; Ctrl-C stops",
          file=sys.stderr, flush=True)
    status = _loop(args, out, sessions)
    for s in sessions:  # (a count short of what the process recorded must say so)
        if not (s.ended or s.error):
            s.error = "stopped before the process's last frame came: records may be missing"
    try:
        out.close()
    except BrokenPipeError:  # -w - into a reader that went away: nothing more goes there
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    for s in sessions:
        s.sock.close()
    _report(args, out, sessions, refused)
    return status


def _loop(args: argparse.Namespace, out: _Output, sessions: list[Session]) -> int:
    inbox: Inbox = queue.SimpleQueue()
    for s in sessions:
        threading.Thread(target=_reader, args=(s, inbox), daemon=True,
                         name=f"smcr-trace-{s.pid}").start()  # fmt: skip
    live = len(sessions)
    until = None if args.duration is None else time.monotonic() + args.duration
    stopping_until: float | None = None
    try:
        with _Signals(inbox):
            while live:
                now = time.monotonic()
                if stopping_until is None and (out.full or (until is not None and now >= until)):
                    stopping_until = _stop(sessions)
                if stopping_until is not None and now >= stopping_until:
                    break
                limit = stopping_until if stopping_until is not None else until
                wait = 0.2 if limit is None else max(0.0, min(0.2, limit - now))
                try:
                    item = inbox.get(timeout=wait)
                except queue.Empty:
                    continue
                if item is None:  # Ctrl-C or SIGTERM
                    if stopping_until is not None:
                        break  # stopping already (-c, --duration): no waiting for the rest
                    stopping_until = _stop(sessions)
                    continue
                session, frame = item
                if frame is None:
                    live -= 1
                    continue
                try:
                    _take(out, session, frame)
                    out.flush()
                except BrokenPipeError:  # -w - into a reader that went away
                    break
    except KeyboardInterrupt:  # a second Ctrl-C: at once
        pass
    return 0


def _stop(sessions: list[Session]) -> float:
    """Tell every process that we are done (our end shut); how long to wait for the rest."""
    for s in sessions:
        with contextlib.suppress(OSError):
            s.sock.shutdown(socket.SHUT_WR)
    return time.monotonic() + END_WAIT


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _report(args: argparse.Namespace, out: _Output, sessions: list[Session],
            refused: list[str]) -> None:  # fmt: skip
    """The summary: a line on standard error, or ``--json``."""
    summary = {"file": args.write, "frames": out.writer.frames,
               "processes": [s.summary() for s in sessions],
               "refused": refused}  # fmt: skip
    if args.json:
        stream = sys.stderr if args.write == "-" else sys.stdout
        print(json.dumps(summary), file=stream)
        return
    dropped = sum(s.dropped for s in sessions)
    n = len(sessions)
    print(f"smcr trace: {out.writer.frames} frames written to {args.write} "
          f"({sum(s.records for s in sessions)} records from {n} process{'es' * (n != 1)}, "
          f"{dropped} dropped by slow reading)", file=sys.stderr)  # fmt: skip
    for s in sessions:
        if s.error:
            print(f"smcr trace: pid {s.pid}: {s.error}", file=sys.stderr)
        if s.framer.bad:
            print(f"smcr trace: pid {s.pid}: {s.framer.bad} records were not proper records",
                  file=sys.stderr)
