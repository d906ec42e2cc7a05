"""The tools' side: find the endpoints this user may see, ask them all, trust none.

Design (the why of each):

* **Every answer is suspect.**  A process may hang, die mid-answer, send
  garbage, announce a huge length or lie.  Each query has one deadline
  (:data:`TIMEOUT`) for connect, request and answer together; an answer
  longer than :data:`~smcr.diag.protocol.MAX_ANSWER` is refused before it is
  read; what is not a JSON object is an error for that process only; and the
  tools print what they got through :func:`text`, which drops control
  characters (a process must not write escape sequences to root's terminal).
* **Side by side**: processes are asked in parallel (:data:`PARALLEL` at a
  time), so one that hangs costs one :data:`TIMEOUT`, not one per process.
* **Stale sockets** (their process died without its ``atexit``: SIGKILL)
  refuse the connect; the tools remove them (the owner, or root).
* **Only a socket file of the directory's owner is asked**, and never through a
  symlink: the file is opened ``O_PATH | O_NOFOLLOW``, checked, and connected
  to through that descriptor (``/proc/self/fd/N``), so a user cannot make
  root's ``smcr ss`` connect to some other socket of the host (a symlink
  ``<pid>.sock`` to it) and write a request there, not even by swapping the
  file between a check and the connect.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smcr.diag import paths, protocol

TIMEOUT = 1.0
PARALLEL = 16


class QueryError(Exception):
    """One process did not answer as it should (timeout, refused, garbage)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A process's socket file, and the uid that owns its directory."""

    path: Path
    pid: int
    owner: int


@dataclass(frozen=True, slots=True)
class Reply:
    """What one process answered (``answer``) or why not (``error``)."""

    endpoint: Endpoint
    answer: dict[str, Any] | None
    error: str = ""


def endpoints() -> list[Endpoint]:
    """Every endpoint in the directories this user may read (:func:`paths.visible_directories`)."""
    found = []
    for directory, uid in paths.visible_directories():
        with contextlib.suppress(OSError):
            for entry in directory.iterdir():
                stem = entry.name.removesuffix(paths.SOCKET_SUFFIX)
                if entry.name.endswith(paths.SOCKET_SUFFIX) and stem.isdigit():
                    found.append(Endpoint(entry, int(stem), uid))
    return sorted(found, key=lambda e: e.pid)


def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise QueryError("timed out")
        sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except TimeoutError:
            raise QueryError("timed out") from None
        if not chunk:
            raise QueryError("closed before the whole answer")
        buf += chunk
    return bytes(buf)


def _connect_no_follow(sock: socket.socket, path: Path, owner: int | None) -> None:
    """Connect to the socket file ``path`` itself (no symlink followed), if it is one
    of ``owner`` (None: any owner).

    :raises QueryError: not a socket file, or another's.
    """
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode) or (owner is not None and st.st_uid != owner):
            raise QueryError("not a socket file of the directory's owner")
        # through the descriptor: the very file checked (where /proc is not mounted, the
        # path, checked just before: a window for a swap, but never a symlink seen)
        proc = f"/proc/self/fd/{fd}"
        sock.connect(proc if os.path.exists(proc) else str(path))
    finally:
        os.close(fd)


def query(path: Path, request: dict[str, Any], timeout: float = TIMEOUT,
          owner: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Ask one endpoint; its answer (a JSON object).

    :param owner: the uid the socket file must belong to (None: any).
    :raises QueryError: no answer within ``timeout``, or not a proper one (or ``path``
        is not a socket file of ``owner``: a symlink, say).
    :raises ConnectionRefusedError: nobody listens (a stale socket file).
    """
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            _connect_no_follow(sock, path, owner)
            sock.sendall(protocol.encode(request))
        except TimeoutError:
            raise QueryError("timed out") from None
        except ConnectionRefusedError:
            raise
        except OSError as exc:
            raise QueryError(exc.strerror or str(exc)) from None
        try:
            header = _recv_exactly(sock, protocol.HEADER, deadline)
            length = protocol.frame_length(header, protocol.MAX_ANSWER)
            return protocol.decode(_recv_exactly(sock, length, deadline))
        except protocol.ProtocolError as exc:
            raise QueryError(str(exc)) from None
        except OSError as exc:
            raise QueryError(exc.strerror or str(exc)) from None


def _ask(ep: Endpoint, request: dict[str, Any], timeout: float, cleanup: bool) -> Reply:
    try:
        answer = query(ep.path, request, timeout, ep.owner)
    except ConnectionRefusedError:
        if cleanup and (os.getuid() == 0 or ep.owner == os.getuid()):
            with contextlib.suppress(OSError):
                ep.path.unlink()
        return Reply(ep, None, "stale (process gone)")
    except (QueryError, OSError) as exc:
        return Reply(ep, None, str(exc) or type(exc).__name__)
    if answer.get("ok") is not True:
        return Reply(ep, None, text(answer.get("error", "refused")))
    if answer.get("pid") != ep.pid:
        return Reply(ep, None, f"answered as pid {text(answer.get('pid'))}")
    return Reply(ep, answer)


def gather(op: str, timeout: float = TIMEOUT, cleanup: bool = True,
           pid: int | None = None) -> list[Reply]:  # fmt: skip
    """Ask every visible endpoint (or only ``pid``'s) ``{"op": op}``, side by side."""
    eps = [e for e in endpoints() if pid is None or e.pid == pid]
    if not eps:
        return []
    request = {"op": op}
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(eps))) as pool:
        return list(pool.map(lambda e: _ask(e, request, timeout, cleanup), eps))


def text(value: Any, limit: int = 200) -> str:
    """A value from another process as printable text: no control characters, bounded."""
    raw = value if isinstance(value, str) else str(value)
    return "".join(ch if ch.isprintable() else "?" for ch in raw[:limit])


def rows_of(reply: Reply, key: str) -> list[dict[str, Any]]:
    """The list ``key`` of an answer, keeping only its objects (a lying process's junk goes)."""
    value = (reply.answer or {}).get(key)
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def process_of(reply: Reply) -> dict[str, Any]:
    """The ``process`` object of an answer (empty if missing or malformed)."""
    value = (reply.answer or {}).get("process")
    return value if isinstance(value, dict) else {}


def errno_name(code: int) -> str:
    """``ECONNREFUSED`` for 111 (messages for the user)."""
    return errno.errorcode.get(code, str(code))
