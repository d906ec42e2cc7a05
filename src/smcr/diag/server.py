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
from typing import Any

from smcr.diag import protocol

CLIENT_TIMEOUT = 2.0
"""Seconds a client has, from accept to the last byte of its answer."""
MAX_CLIENTS = 16
_CRED = struct.Struct("3i")

Answer = Callable[[dict[str, Any]], dict[str, Any]]


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


class Endpoint:
    """The listening socket and its thread (module docstring)."""

    def __init__(self, path: Path, answer: Answer) -> None:
        """Bind ``path`` (a stale file of a dead process of the same pid is replaced),
        and start answering with ``answer(request) -> dict``.

        :raises OSError: when the socket cannot be made.
        """
        self.path = path
        self.answer = answer
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
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._running = True
        self._clients: dict[int, _Client] = {}
        self._thread = threading.Thread(target=self._run, name="smcr-diag", daemon=True)
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
        for key, mask in sel.select(max(0.0, timeout)):
            if key.fileobj is self.sock:
                self._accept(sel)
            elif key.fileobj is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                client: _Client = key.data
                if mask & selectors.EVENT_READ and client.outbox is None:
                    self._read(sel, client)
                elif mask & selectors.EVENT_WRITE and client.outbox is not None:
                    self._write(sel, client)
        now = time.monotonic()
        for client in [c for c in self._clients.values() if c.deadline <= now]:
            self._drop(sel, client)

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(MAX_CLIENTS):
            try:
                conn, _addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # EMFILE and the like: try again next round
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
        client.outbox = memoryview(self._respond(bytes(client.inbox[protocol.HEADER :])))
        sel.modify(client.sock, selectors.EVENT_WRITE, client)
        self._write(sel, client)

    def _respond(self, body: bytes) -> bytes:
        try:
            request = protocol.decode(body)
            op = request.get("op")
            if op not in protocol.OPS:
                raise protocol.ProtocolError(f"unknown op {op!r}")
            answer = self.answer(request)
            answer.setdefault("ok", True)
        except protocol.ProtocolError as exc:
            answer = {"ok": False, "error": str(exc)}
        except Exception as exc:  # the answer's bug: the tool hears of it, we go on
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        answer["v"] = protocol.VERSION
        answer["pid"] = self.pid
        self.answered += 1
        return protocol.encode(answer)

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
        if not client.outbox:
            self._drop(sel, client)

    def _drop(self, sel: selectors.BaseSelector, client: _Client) -> None:
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
