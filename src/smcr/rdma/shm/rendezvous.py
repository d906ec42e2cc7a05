"""How shm devices find each other: a private directory of unix sockets named by GID.

Design decisions:

* **The GID names the rendezvous.**  A shm GID is ``fd73:6d63:7273:686d::/64``
  (ULA prefix ``fd`` then ASCII "smcrshm") followed by a random 64-bit device id;
  the device listens on ``<dir>/<gid hex>.sock``.  So a QP given a peer GID by
  CLC (as SMC-R does) reaches the peer's device with no registry.
* **Two addresses per device, one reach each.**  The device listens on a
  filesystem path in its user's private directory *and* on an abstract unix
  socket named by the GID (:func:`abstract_address`).  The path reaches the
  same user's processes in every network namespace that sees the directory;
  the abstract name reaches every process of the same network namespace,
  whatever its user or mount namespace (a container with its own ``/run`` and
  ``/dev/shm`` but the host's network, or ``nobody`` talking to root), which is
  what Linux's loopback serves.  A requester tries the path first (what one
  user always had), then the abstract name (:func:`connect_any`).  Only a
  container with its own network *and* its own ``/run`` reaches neither (it
  declines in CLC already, its address not being the host's; should the
  addresses agree, the QP cannot come up: ``ERR_RDYLNK``, and ``smcr chk``
  names the fix).
* **Reachable is not trusted.**  Anyone in the network namespace can connect
  to the abstract name (it has no file mode), so what a connection gets is
  bound to the QP it claims: a hello must match the QP's destination and come
  from the process behind it (:func:`credentials`, :mod:`smcr.rdma.shm.inbound`),
  and a memory region's segment goes only to the holder of that connection's
  token (:mod:`smcr.rdma.shm.device`).  Nor is a connection waited for: the
  device reads a request when it is there, so one that says nothing holds up
  nobody's hello or look-up.
* **A private directory**: ``/run/smcr`` for root, ``$XDG_RUNTIME_DIR/smcr`` or
  ``<tmp>/smcr-<uid>`` otherwise, created 0700 and refused if it is a symlink,
  owned by someone else or open to others, so nobody can pre-create or squat
  a rendezvous path.  The abstract name cannot be squatted either: the GID
  is 64 fresh random bits, unknown to anyone before the device binds it.
* **Stale sockets** of dead processes (SIGKILL leaves the file) are found by a
  refused connect and removed when a device opens.
* **SOCK_SEQPACKET** keeps message boundaries, so a message is one ``recvmsg``
  carrying its descriptors (SCM_RIGHTS); EOF/HUP on it is how a peer's death
  shows, even after SIGKILL, because the kernel closes the dead process's end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from smcr.bound import get_ident
from smcr.rdma.verbs import GID_LEN, VerbsError

GID_PREFIX = b"\xfdsmcrshm"
MAGIC = b"SMCR"

#: magic, kind, a, b, c, d, gid: one fixed layout for every control message.
MESSAGE = struct.Struct("<4sB3xIIII16s")
MAX_FDS = 5

HELLO = 1  # a = src qpn, b = dst qpn, c = HELLO_* flags, gid = src gid
HELLO_OK = 2  # a = the QP's mark offset (0: none), gid = token for GET_MR; fds: receive area,
# recv CQ doorbell (write end), MR table, and the CQ's notification segment if it has one,
# then its standby doorbell (write end) if the hello asked for it
HELLO_MARKS = 1  # the requester sets the QP's mark byte after each SEND (smcr.rdma.shm.cq)
HELLO_STANDBY = 2  # the requester rings the standby doorbell for an ARMED word of 2
GET_MR = 3  # a = rkey, gid = the token of the requester's connection
MR_OK = 4  # a = table index, b = generation, c = 1 if writable, d = seal; fd: the MR segment
MR_AT = 7  # as MR_OK, for an MR at an offset in its segment: gid = the offset (u64)
NACK = 5  # a = errno
QP_ERR = 6  # the requester NAKed with a class-C error: move your QP to ERR (spec §5.3)

OFFSET = struct.Struct("<Q8x")
"""MR_AT's offset, in the gid field."""
CONNECT_TIMEOUT = 2.0
CREDENTIALS = struct.Struct("3i")  # struct ucred


@dataclass(frozen=True, slots=True)
class Message:
    """One decoded control message with the descriptors that came with it."""

    kind: int
    a: int = 0
    b: int = 0
    c: int = 0
    d: int = 0
    gid: bytes = bytes(GID_LEN)


def default_directory() -> Path:
    """The per-user rendezvous directory (see the module docstring for why these)."""
    if env := os.environ.get("SMCR_SHM_DIR"):
        return Path(env)
    uid = os.getuid()
    if uid == 0:
        return Path("/run/smcr")
    if xdg := os.environ.get("XDG_RUNTIME_DIR"):
        return Path(xdg) / "smcr"
    return Path(tempfile.gettempdir()) / f"smcr-{uid}"


def ensure_private_directory(path: Path) -> Path:
    """Create ``path`` 0700 if missing; refuse one we do not own alone.

    :raises VerbsError: EPERM if it is a symlink, not a directory, owned by
        another user or accessible to group/others.
    """
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=False)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise VerbsError(errno.EPERM, f"{path} is not a private directory of uid {os.getuid()}")
    return path


def new_gid() -> bytes:
    """A fresh shm GID: the fixed prefix and 64 random bits."""
    return GID_PREFIX + secrets.token_bytes(8)


def is_shm_gid(gid: bytes) -> bool:
    """Whether ``gid`` belongs to a shm device (and so names a rendezvous)."""
    return len(gid) == GID_LEN and gid.startswith(GID_PREFIX)


def socket_path(directory: Path, gid: bytes) -> str:
    """The rendezvous path of the device with ``gid``."""
    path = str(directory / f"{gid.hex()}.sock")
    if len(path.encode()) >= 108:
        raise VerbsError(errno.ENAMETOOLONG, f"rendezvous path too long: {path}")
    return path


def remove_stale(directory: Path) -> int:
    """Unlink socket files nobody listens on any more (their process died).

    :returns: how many were removed.
    """
    removed = 0
    for entry in directory.glob("*.sock"):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe.settimeout(0.2)
        try:
            probe.connect(str(entry))
        except ConnectionRefusedError:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed += 1
        except OSError:
            pass
        finally:
            probe.close()
    return removed


def listen(path: str) -> socket.socket:
    """Bind and listen on ``path`` (mode 0600, non-blocking for the engine).

    The socket is bound under a temporary name and renamed to ``path`` only once
    it listens: another process's :func:`remove_stale` takes a bound socket that
    does not listen yet (connect refused) for a dead one and would unlink it.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # beside it, shorter than it, and not "*.sock": remove_stale never looks at it
    tmp = os.path.join(os.path.dirname(path), f".new{os.getpid()}.{get_ident() % 9973}")
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        old = os.umask(0o177)
        try:
            sock.bind(tmp)
        finally:
            os.umask(old)
        sock.listen(64)
        os.rename(tmp, path)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return sock


def connect(path: str, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """Connect to a rendezvous; the socket is blocking with ``timeout``.

    :raises VerbsError: EHOSTUNREACH when no device listens there.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise VerbsError(errno.EHOSTUNREACH, f"no shm device at {path}") from exc
    except BaseException:
        sock.close()
        raise
    return sock


ABSTRACT_PREFIX = "smcr-shm-"
"""An abstract rendezvous is NUL, this, and the GID in hex."""


def abstract_address(gid: bytes) -> str:
    """The abstract unix socket name of the device with ``gid`` (module docstring)."""
    return f"\0{ABSTRACT_PREFIX}{gid.hex()}"


def listen_abstract(gid: bytes) -> socket.socket:
    """Bind and listen on :func:`abstract_address` (non-blocking for the engine).

    :raises VerbsError: EADDRINUSE if the name is taken (64 random bits: never by chance).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.bind(abstract_address(gid))
        sock.listen(64)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise VerbsError(errno.EADDRINUSE, f"shm rendezvous {gid.hex()} taken") from exc
    return sock


def connect_any(directory: Path, gid: bytes, timeout: float = CONNECT_TIMEOUT
                ) -> tuple[socket.socket, str]:  # fmt: skip
    """Connect to the device with ``gid``: its path in ``directory``, else its abstract name.

    :returns: the socket and the address that answered (for later requests).
    :raises VerbsError: EHOSTUNREACH when neither answers.
    """
    path = socket_path(directory, gid)
    try:
        return connect(path, timeout), path
    except (VerbsError, PermissionError):
        address = abstract_address(gid)
        try:
            return connect(address, timeout), address
        except VerbsError as exc:
            raise VerbsError(errno.EHOSTUNREACH,
                             f"no shm device {gid.hex()} in {directory} nor in this network "
                             "namespace") from exc  # fmt: skip


def credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The (pid, uid, gid) of the process at the other end (``SO_PEERCRED``), as the
    kernel gives them in our namespaces (pid 0 for a process our pid namespace cannot see)."""
    pid, uid, gid = CREDENTIALS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, CREDENTIALS.size)
    )
    return pid, uid, gid


def send(sock: socket.socket, msg: Message, fds: list[int] | None = None) -> None:
    """Send one control message, with descriptors if given."""
    data = MESSAGE.pack(MAGIC, msg.kind, msg.a, msg.b, msg.c, msg.d, msg.gid)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[Message, list[int]] | None:
    """Receive one control message; ``None`` on EOF (the peer closed or died).

    Descriptors of a malformed message are closed, never leaked.

    :raises VerbsError: EPROTO for a message that is not ours.
    """
    data, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE.size, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    if len(data) != MESSAGE.size or data[:4] != MAGIC:
        for fd in fds:
            os.close(fd)
        raise VerbsError(errno.EPROTO, "malformed shm control message")
    _magic, kind, a, b, c, d, gid = MESSAGE.unpack(data)
    return Message(kind, a, b, c, d, gid), fds


def request(path: str, msg: Message, timeout: float = CONNECT_TIMEOUT) -> tuple[Message, list[int]]:
    """One request/answer exchange on a fresh connection (a requester's MR look-ups keep
    theirs: :meth:`smcr.rdma.shm.peer.PeerLink._ask`).

    :raises VerbsError: EHOSTUNREACH if the device is gone or does not answer.
    """
    sock = connect(path, timeout)
    try:
        return exchange(sock, msg, path)
    finally:
        sock.close()


def exchange(sock: socket.socket, msg: Message, path: str) -> tuple[Message, list[int]]:
    """Send ``msg`` to the device at ``path`` over ``sock`` and receive its answer.

    :raises VerbsError: EHOSTUNREACH if the device does not answer or hung up (the caller
        closes ``sock``).
    """
    try:
        send(sock, msg)
        answer = receive(sock)
    except OSError as exc:
        raise VerbsError(errno.EHOSTUNREACH, f"shm device at {path} did not answer") from exc
    if answer is None:
        raise VerbsError(errno.EHOSTUNREACH, f"shm device at {path} hung up")
    return answer
