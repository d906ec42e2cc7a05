"""User EIDs (UEIDs): the host's SMC-Rv2 "enterprise IDs", as smc-tools' ``smc_ueid``.

Why they exist: SMC-Rv2 is routable, so two hosts may only use it when they
share a user EID (the CLC Proposal lists the client's, the server picks the
first one it also has: Linux ``smc_clc_match_eid``).  Linux keeps them in a
kernel table of at most 8 (``SMC_CLC_MAX_UEID``), set through netlink by
``smc_ueid add|del|flush`` and read by every SMC socket.  smcr has no kernel,
so the table is a file:

* :data:`DEFAULT_FILE` (``/etc/smcr/ueid``), written by root with
  ``smcr ueid add|del|flush`` and read by every smcr process, one UEID per
  line (blank padding stripped, ``#`` starts a comment);
  ``SMCR_UEID_FILE`` names another file (tests, unprivileged use).
* A UEID is valid as Linux ``smc_clc_ueid_valid`` says: padded with blanks to
  32 bytes, what remains after trailing white space is removed is not empty,
  starts with a letter or digit, and holds only upper-case letters, digits,
  ``.`` and ``-`` (kernel ``isalnum``/``islower``: ASCII here).  Lower case is
  refused as the kernel refuses it, not folded.
* On the wire a UEID is those 32 bytes, blank padded (:func:`encode`);
  :func:`smcr.wire.clc.make_eid` is the codec-level twin.

Reading is cheap and current: :class:`UeidTable` re-reads the file only when
its modification time or size changed, so a ``smcr ueid add`` reaches running
processes at their next connection, as the kernel table does.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import string
from collections.abc import Mapping
from pathlib import Path

MAX_UEIDS = 8
"""``SMC_CLC_MAX_UEID``: the most UEIDs a host holds (and a Proposal carries)."""
EID_LEN = 32
"""``SMC_MAX_EID_LEN``."""
DEFAULT_FILE = Path("/etc/smcr/ueid")
ENV = "SMCR_UEID_FILE"
_DEFAULT_NAME = str(DEFAULT_FILE)
"""(A string: a ``Path`` costs two interpreted calls per ``os.stat``, at every handshake.)"""

_UPPER_ALNUM = frozenset(string.ascii_uppercase + string.digits)
_ALLOWED = _UPPER_ALNUM | {".", "-"}


class UeidError(ValueError):
    """A UEID is invalid, or the table cannot take the change (Linux's errno named)."""

    def __init__(self, message: str, errno_name: str = "EINVAL") -> None:
        super().__init__(message)
        self.errno_name = errno_name


def encode(text: str) -> bytes:
    """A UEID as it travels and as the kernel stores it: 32 bytes, blank padded.

    :raises UeidError: longer than 32 characters or invalid (:func:`valid`).
    """
    if len(text) > EID_LEN:
        raise UeidError(f"UEID {text!r} is longer than {EID_LEN} characters")
    padded = text.ljust(EID_LEN)
    if not valid(padded):
        raise UeidError(f"invalid UEID {text!r}: 1-32 characters of A-Z, 0-9, '.' and '-', "
                        "starting with a letter or digit")
    return padded.encode("ascii")


def valid(padded: str) -> bool:
    """Linux ``smc_clc_ueid_valid`` on a 32-character, blank-padded UEID."""
    body = padded[:EID_LEN].rstrip(" \t\n\v\f\r")
    if not body or body[0] not in _UPPER_ALNUM:
        return False
    return all(c in _ALLOWED for c in body)


def decode(eid: bytes) -> str:
    """A 32-byte EID from the wire as text, blank padding removed (for display)."""
    return eid.decode("ascii", "replace").rstrip(" ")


def path_from(env: Mapping[str, str] | None = None) -> Path:
    """The UEID file: ``SMCR_UEID_FILE`` or :data:`DEFAULT_FILE`."""
    env = os.environ if env is None else env
    return Path(env.get(ENV) or DEFAULT_FILE)


def parse(text: str) -> tuple[bytes, ...]:
    """The UEIDs of a file's text, in order, each 32 bytes; invalid lines are skipped
    (a hand-edited file must not stop every connection), duplicates kept once and at
    most :data:`MAX_UEIDS` taken."""
    out: list[bytes] = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            eid = encode(entry)
        except UeidError:
            continue
        if eid not in out and len(out) < MAX_UEIDS:
            out.append(eid)
    return tuple(out)


def load(path: Path | None = None) -> tuple[bytes, ...]:
    """The host's UEIDs (none when the file does not exist or cannot be read)."""
    try:
        return parse((path or path_from()).read_text(encoding="ascii", errors="replace"))
    except OSError:
        return ()


def invalid_lines(path: Path | None = None) -> list[tuple[int, str]]:
    """The lines of the file that :func:`parse` skips, numbered from 1 (``smcr ueid show``
    reports them: a skipped line must not go unnoticed)."""
    try:
        text = (path or path_from()).read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    bad = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        try:
            if entry:
                encode(entry)
        except UeidError:
            bad.append((number, line))
    return bad


def _store(path: Path, eids: tuple[bytes, ...]) -> None:
    """Write the table (:func:`store_text`)."""
    store_text(path, "".join(decode(e) + "\n" for e in eids))


def store_text(path: Path, text: str) -> None:
    """Write a host table atomically, readable by everyone (root writes, all read);
    :mod:`smcr.pnet` writes its table so too.

    The temporary file has a name nobody can guess and is created new, never through a
    symlink (``O_EXCL | O_NOFOLLOW``): with ``SMCR_UEID_FILE`` in a shared directory,
    a name made of the pid let another user aim root's write at a file of theirs.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(text)
        os.chmod(tmp, 0o644)  # (whatever the umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def add(text: str, path: Path | None = None) -> bytes:
    """Add a UEID (Linux ``smc_clc_ueid_add``): ``EINVAL`` if invalid, ``ERANGE`` if 8
    are set, ``EEXIST`` if it is there.

    :returns: the 32-byte UEID added.
    """
    path = path or path_from()
    eid = encode(text)
    eids = load(path)
    if len(eids) >= MAX_UEIDS:
        raise UeidError(f"already {MAX_UEIDS} UEIDs", "ERANGE")
    if eid in eids:
        raise UeidError(f"UEID {decode(eid)!r} is already set", "EEXIST")
    _store(path, (*eids, eid))
    return eid


def remove(text: str, path: Path | None = None) -> None:
    """Remove a UEID (``smc_clc_ueid_remove``): ``ENOENT`` if it is not set."""
    path = path or path_from()
    eid = encode(text)
    eids = load(path)
    if eid not in eids:
        raise UeidError(f"UEID {decode(eid)!r} is not set", "ENOENT")
    _store(path, tuple(e for e in eids if e != eid))


def flush(path: Path | None = None) -> None:
    """Remove every UEID (``smc_nl_flush_ueid``)."""
    _store(path or path_from(), ())


def file_key(name: str | Path) -> tuple[int, int] | None:
    """A table file's (mtime, size), what a table re-reads on; None when there is no file.
    Looked at per handshake, so the usual case, no file, costs no exception (``os.stat``'s
    ``FileNotFoundError`` was half of the look)."""
    if not os.access(name, os.F_OK):
        return None
    try:
        st = os.stat(name)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class UeidTable:
    """The host's UEIDs as a process sees them, re-read when the file changes.

    One ``access`` per call, and a ``stat`` where the file is (:func:`file_key`): the CLC
    handshake asks at every connection, as Linux reads its table at every Proposal and
    Accept.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._key: tuple[int, int] | None = None
        self._eids: tuple[bytes, ...] = ()

    def current(self) -> tuple[bytes, ...]:
        """The UEIDs now in force (``()`` when none is set)."""
        name = self.path or os.environ.get(ENV) or _DEFAULT_NAME  # (path_from, without a Path)
        key = file_key(name)
        if key is None:
            self._key, self._eids = None, ()
            return ()
        if key != self._key:
            self._key, self._eids = key, load(Path(name))
        return self._eids
