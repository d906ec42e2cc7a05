"""The per-process diag endpoint: a thread of its own answering the tools on a unix socket.

Design (the why of each):

* **Never on the data path**: one daemon thread (``smcr-diag``) owns the
  listening socket and every client; application and progress threads never
  touch it.  What it reads of the runtime it reads under the runtime's lock,
  taken with a timeout (:mod:`smcr.diag.snapshot`), so a stuck runtime makes
  an answer partial, not the endpoint stuck.
* **A hostile client can neither crash nor stall it**: non-blocking sockets
  under one selector; a request longer than :data:`~smcr.diag.protocol.MAX_REQUEST`
  or not JSON closes the connection; each client has :data:`CLIENT_TIMEOUT` in
  all to send its request and take the answer (a slow reader is dropped, a
  slow writer too); at most :data:`MAX_CLIENTS` at a time, more are closed at
  once; any exception while answering becomes an error answer.
* **Who may ask**: the socket file is 0600 in a 0700 directory, and the peer's
  credentials (``SO_PEERCRED``) are checked on accept: our own uid or root.
  The directory keeps others out; the check holds even where the directory
  was made open (the tests do that, to see the check work).
* **Streams** (``smcr trace``, :mod:`smcr.diag.trace`): a ``trace`` request's
  answer is followed by frames of records for as long as the tool stays.  The
  thread sends them without ever blocking (what the tool does not take in time
  stays in the tracer's bounded queue, which drops and counts); a tool that
  takes nothing for :data:`STREAM_STALL` is dropped; the tool shuts its end to
  say it is done, and gets what was recorded until then, then a last frame.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from smcr import plainsock
from smcr.diag import protocol
from smcr.osthreads import NamedThread

CLIENT_TIMEOUT = 2.0
"""Seconds a client has, from accept to the last byte of its answer."""
MAX_CLIENTS = 16
STREAM_TICK = 0.05
"""Seconds between looks at a stream's new records."""
STREAM_STALL = 30.0
"""Seconds a streaming client may take nothing before it is dropped (its trace ends)."""
_CRED = struct.Struct("3i")

Answer = Callable[[dict[str, Any]], dict[str, Any]]


class Stream(Protocol):
    """What a streaming request's client gets after its answer (:mod:`smcr.diag.trace`)."""

    def next_frame(self) -> dict[str, Any] | None:
        """The next frame, or None when there is nothing now (or nothing more after the end)."""

    @property
    def ended(self) -> bool:
        """The last frame has been taken."""

    def stop(self) -> None:
        """The client is done: finish (the frames left, then a last one)."""

    def close(self) -> None:
        """The client is gone."""


Opener = Callable[[dict[str, Any]], tuple[dict[str, Any], Stream]]


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (``SO_PEERCRED``)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size)
    return int(_CRED.unpack(raw)[1])


def allowed(uid: int) -> bool:
    """Whether ``uid`` may read this process: itself, and root."""
    return uid in (0, os.geteuid(), os.getuid())


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None
    stream: Stream | None = None
    stopping: bool = False  # a stream's client shut its end: finish, then drop


class Endpoint:
    """The listening socket and its thread (module docstring)."""

    def __init__(self, path: Path, answer: Answer, streams: dict[str, Opener] | None = None
                 ) -> None:  # fmt: skip
        """Bind ``path`` (a stale file of a dead process of the same pid is replaced),
        and start answering with ``answer(request) -> dict``; a request whose op is in
        ``streams`` gets ``opener(request)``'s answer, then its stream (module docstring).

        :raises OSError: when the socket cannot be made.
        """
        self.path = path
        self.answer = answer
        self.streams = dict(streams or {})
        self.pid = os.getpid()
        self.answered = 0
        self.refused = 0
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # named by our pid: whoever had it is dead
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o177)
            try:
                self.sock.bind(str(path))
            finally:
                os.umask(old)
            self.sock.listen(MAX_CLIENTS)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self._wake_r, self._wake_w = plainsock.socketpair()
        self._wake_r.setblocking(False)
        self._running = True
        self._clients: dict[int, _Client] = {}
        self._accept_paused_until: float | None = None
        self._thread = NamedThread(target=self._run, name="smcr-diag", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while self._running:
                try:
                    self._round(sel)
                except Exception:  # a bug here must not end the endpoint
                    traceback.print_exc(file=sys.stderr)
                    time.sleep(0.05)
        finally:
            for client in list(self._clients.values()):
                self._drop(sel, client)
            sel.close()

    def _round(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        timeout = min((c.deadline for c in self._clients.values()), default=now + 60) - now
        streaming = [c for c in self._clients.values() if c.stream is not None]
        if streaming:
            timeout = min(timeout, STREAM_TICK)
        if self._accept_paused_until is not None:
            if now >= self._accept_paused_until:
                sel.register(self.sock, selectors.EVENT_READ, None)
                self._accept_paused_until = None
            else:
                timeout = min(timeout, self._accept_paused_until - now)
        for key, mask in sel.select(max(0.0, timeout)):
            if key.fileobj is self.sock:
                self._accept(sel)
            elif key.fileobj is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                client: _Client = key.data
                if client.stream is not None and mask & selectors.EVENT_READ:
                    self._stream_read(sel, client)
                elif mask & selectors.EVENT_READ and client.outbox is None:
                    self._read(sel, client)
                elif mask & selectors.EVENT_WRITE and client.outbox is not None:
                    self._write(sel, client)
        for client in streaming:
            if client.outbox is None and client.sock.fileno() in self._clients:
                self._feed(sel, client)
        now = time.monotonic()
        for client in [c for c in self._clients.values() if c.deadline <= now]:
            self._drop(sel, client)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(MAX_CLIENTS):
            try:
                conn = plainsock.accept(self.sock)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: left alone a while (it stays readable)
                sel.unregister(self.sock)
                self._accept_paused_until = time.monotonic() + plainsock.ACCEPT_PAUSE
                return
            try:
                ok = allowed(peer_uid(conn)) and len(self._clients) < MAX_CLIENTS
            except OSError:
                ok = False
            if not ok:
                self.refused += 1
                conn.close()
                continue
            conn.setblocking(False)
            client = _Client(conn, time.monotonic() + CLIENT_TIMEOUT)
            self._clients[conn.fileno()] = client
            sel.register(conn, selectors.EVENT_READ, client)

    def _read(self, sel: selectors.BaseSelector, client: _Client) -> None:
        try:
            data = client.sock.recv(protocol.MAX_REQUEST + protocol.HEADER)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, client)
            return
        client.inbox += data
        if len(client.inbox) < protocol.HEADER:
            return
        try:
            length = protocol.frame_length(bytes(client.inbox[: protocol.HEADER]),
                                           protocol.MAX_REQUEST)  # fmt: skip
        except protocol.ProtocolError:
            self._drop(sel, client)
            return
        if len(client.inbox) < protocol.HEADER + length:
            return
        if len(client.inbox) > protocol.HEADER + length:  # one request per connection
            self._drop(sel, client)
            return
        body, client.stream = self._respond(bytes(client.inbox[protocol.HEADER :]))
        client.outbox = memoryview(body)
        sel.modify(client.sock, selectors.EVENT_WRITE, client)
        self._write(sel, client)

    def _respond(self, body: bytes) -> tuple[bytes, Stream | None]:
        stream = None
        try:
            request = protocol.decode(body)
            op = request.get("op")
            if op not in protocol.OPS:
                raise protocol.ProtocolError(f"unknown op {op!r}")
            opener = self.streams.get(op)
            if opener is not None:
                answer, stream = opener(request)
            else:
                answer = self.answer(request)
            answer.setdefault("ok", True)
        except protocol.ProtocolError as exc:
            answer = {"ok": False, "error": str(exc)}
        except Exception as exc:  # the answer's bug: the tool hears of it, we go on
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answer["v"] = protocol.VERSION
        answer["pid"] = self.pid
        self.answered += 1
        return protocol.encode(answer), stream

    # ------------------------------------------------------------ streams

    def _feed(self, sel: selectors.BaseSelector, client: _Client) -> None:
        """Give a streaming client its next frame, if there is one (never blocks)."""
        stream = client.stream
        assert stream is not None
        frame = stream.next_frame()
        if frame is None:
            if stream.ended:
                self._drop(sel, client)
            else:
                client.deadline = time.monotonic() + STREAM_STALL  # nothing to take: not stalled
            return
        client.outbox = memoryview(protocol.encode(frame))
        self._watch(sel, client)
        self._write(sel, client)

    def _watch(self, sel: selectors.BaseSelector, client: _Client) -> None:
        """Select a streaming client for what it needs: its end (until it said it is done;
        EOF stays readable) and room for a pending frame."""
        events = (0 if client.stopping else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if client.outbox is not None else 0)
        try:
            key: selectors.SelectorKey | None = sel.get_key(client.sock)
        except KeyError:
            key = None
        if key is None:
            if events:
                sel.register(client.sock, events, client)
        elif not events:
            sel.unregister(client.sock)
        elif key.events != events:
            sel.modify(client.sock, events, client)

    def _stream_read(self, sel: selectors.BaseSelector, client: _Client) -> None:
        """A streaming client sends nothing but its end (done): anything else drops it."""
        try:
            data = client.sock.recv(64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sel, client)
            return
        if data or client.stopping:
            self._drop(sel, client)
            return
        client.stopping = True
        assert client.stream is not None
        client.stream.stop()
        self._watch(sel, client)

    def _write(self, sel: selectors.BaseSelector, client: _Client) -> None:
        out = client.outbox
        assert out is not None
        try:
            n = client.sock.send(out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(sel, client)
            return
        client.outbox = out[n:]
        if client.stream is not None:
            client.deadline = time.monotonic() + STREAM_STALL  # it takes what we send
            if not client.outbox:
                client.outbox = None
                self._watch(sel, client)
            return
        if not client.outbox:
            self._drop(sel, client)

    def _drop(self, sel: selectors.BaseSelector, client: _Client) -> None:
        if client.stream is not None:
            stream, client.stream = client.stream, None
            try:
                stream.close()
            except Exception:  # a stream's bug must not keep the client
                traceback.print_exc(file=sys.stderr)
        self._clients.pop(client.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            sel.unregister(client.sock)
        client.sock.close()

    # ------------------------------------------------------------ ending

    def drop_inherited(self) -> None:
        """In a forked child: close the copies of the parent's descriptors that fork made
        (the thread that served them is the parent's).  Kept open, the child's copy of
        the listening socket went on taking connections nobody answered: a parent killed
        with its file left behind looked hung to the tools (a timeout each time), not
        stale (refused, and removed)."""
        self._running = False
        for sock in (self.sock, self._wake_r, self._wake_w,
                     *(c.sock for c in self._clients.values())):  # fmt: skip
            with contextlib.suppress(OSError):
                sock.close()
        self._clients.clear()

    def close(self, unlink: bool = True) -> None:
        """Stop the thread, close the socket and (in the process that made it) unlink it."""
        if not self._running:
            return
        self._running = False
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        self.sock.close()
        if unlink and self.pid == os.getpid():
            with contextlib.suppress(OSError):
                self.path.unlink()
        if not self._thread.is_alive():
            self._wake_r.close()
            self._wake_w.close()
