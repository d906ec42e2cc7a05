"""PNET IDs: which RNICs and net devices share a physical network, as smc-tools' ``smc_pnet``.

Why they exist: a host may have RNICs on networks that do not reach each other.
Linux tags net devices and RNIC ports with a PNET ID (``smc_pnet -a PNETID
-I NETDEV -D RNIC``, kept in the kernel's ``smc_pnettable``) and then

* at first contact takes an RNIC whose PNET ID is the one of the net device
  the TCP connection uses (``smc_pnet_find_roce_resource``; without a PNET ID,
  the RNIC on that net device);
* adds a further link to a group only over a port of the group's PNET ID
  (``smc_pnet_find_alt_roce``; two ports without one match).

smcr has no kernel, so the table is a file, as :mod:`smcr.ueid`'s:

* :data:`DEFAULT_FILE` (``/etc/smcr/pnet``), written by root with ``smcr pnet
  add|del|flush`` and read by every smcr process; ``SMCR_PNET_FILE`` names
  another file (tests, one process, unprivileged use).  One entry a line,
  ``PNETID netdev NAME`` or ``PNETID rnic NAME`` (``#`` starts a comment).
* A PNET ID is valid as Linux ``smc_pnetid_valid`` says: blanks around it are
  dropped, what remains is 1 to 16 letters and digits, lower case is folded to
  upper case (unlike a UEID, which the kernel refuses in lower case).
* As Linux, a name has one PNET ID: adding a name already in the table
  leaves its entry, and an add that adds nothing fails ``EEXIST``; a name need
  not exist when it is added (the kernel keeps such entries for later too).
* Which name an RNIC has here: a RoCE RNIC its device name (``roce_eth0``...) and
  the net device it serves; a shm RNIC, whose device name carries its pid,
  ``shm0``, ``shm1``... by its place among the process's RNICs
  (``SMCR_SHM_RNICS``).  An RNIC entry wins; else, since every smcr RoCE RNIC
  is bound to one net device as rxe is, the net device's entry is the RNIC's
  too (Linux wants ``-D`` for the RNIC; smc-tools users give both, as
  ``shared/interop/tools/smc-setup.sh`` does).

Reading is cheap and current (:class:`PnetTable`): a runtime re-reads the file
when it changed, at its next connection.
"""

from __future__ import annotations

import os
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from smcr.ueid import file_key, store_text

MAX_LEN = 16
"""``SMC_MAX_PNETID_LEN``."""
DEFAULT_FILE = Path("/etc/smcr/pnet")
ENV = "SMCR_PNET_FILE"
_DEFAULT_NAME = str(DEFAULT_FILE)
"""(A string: a ``Path`` costs two interpreted calls per ``os.stat``, at every handshake.)"""
KINDS = ("netdev", "rnic")

_ALNUM = frozenset(string.ascii_uppercase + string.digits)


class PnetError(ValueError):
    """A PNET ID or entry is invalid, or the table cannot take the change (errno named)."""

    def __init__(self, message: str, errno_name: str = "EINVAL") -> None:
        super().__init__(message)
        self.errno_name = errno_name


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of the table: ``name`` (a net device or an RNIC, ``kind``) is on ``pnetid``."""

    pnetid: str
    kind: str
    name: str


def normalize(text: str) -> str:
    """Linux ``smc_pnetid_valid``: the PNET ID as the kernel stores it (module docstring).

    :raises PnetError: empty, longer than 16, or not letters and digits (``EINVAL``).
    """
    body = text.strip(" \t\n\v\f\r")
    if not body or len(body) > MAX_LEN:
        raise PnetError(f"invalid PNET ID {text!r}: 1-{MAX_LEN} letters and digits")
    up = body.upper() if body.isascii() else body
    if not all(c in _ALNUM for c in up):
        raise PnetError(f"invalid PNET ID {text!r}: 1-{MAX_LEN} letters and digits")
    return up


def path_from(env: Mapping[str, str] | None = None) -> Path:
    """The table file: ``SMCR_PNET_FILE`` or :data:`DEFAULT_FILE`."""
    env = os.environ if env is None else env
    return Path(env.get(ENV) or DEFAULT_FILE)


def _name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > 64 or any(c.isspace() or c == "#" for c in name):
        raise PnetError(f"invalid device name {name!r}")
    return name


def parse(text: str) -> tuple[Entry, ...]:
    """The entries of a file's text, in order; invalid lines are skipped (a hand-edited
    file must not stop every connection), a name's first entry kept."""
    out: list[Entry] = []
    seen: set[tuple[str, str]] = set()
    for line in text.splitlines():
        entry = _entry(line)
        if entry is not None and (entry.kind, entry.name) not in seen:
            seen.add((entry.kind, entry.name))
            out.append(entry)
    return tuple(out)


def _entry(line: str) -> Entry | None:
    """The entry of one line; None for an empty or comment line, or an invalid one."""
    words = line.split("#", 1)[0].split()
    if len(words) != 3 or words[1] not in KINDS:
        return None
    try:
        return Entry(normalize(words[0]), words[1], _name(words[2]))
    except PnetError:
        return None


def invalid_lines(path: Path | None = None) -> list[tuple[int, str]]:
    """The lines of the file that :func:`parse` skips (not empty, not a comment), numbered
    from 1 (``smcr pnet show`` reports them: a skipped line must not go unnoticed)."""
    try:
        text = (path or path_from()).read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    return [(number, line) for number, line in enumerate(text.splitlines(), 1)
            if line.split("#", 1)[0].strip() and _entry(line) is None]  # fmt: skip


def load(path: Path | None = None) -> tuple[Entry, ...]:
    """The host's table (empty when the file does not exist or cannot be read)."""
    try:
        return parse((path or path_from()).read_text(encoding="ascii", errors="replace"))
    except OSError:
        return ()


def _store(path: Path, entries: Iterable[Entry]) -> None:
    store_text(path, "".join(f"{e.pnetid} {e.kind} {e.name}\n" for e in entries))


def add(pnetid: str, netdev: str | None = None, rnic: str | None = None,
        path: Path | None = None) -> str:  # fmt: skip
    """Add entries (``smc_pnet -a PNETID [-I NETDEV] [-D RNIC]``, Linux ``smc_pnet_enter``):
    ``EINVAL`` for an invalid PNET ID or no device, ``EEXIST`` when every name given is
    already in the table (whatever its PNET ID).

    :returns: the PNET ID as stored (upper case).
    """
    path = path or path_from()
    pid = normalize(pnetid)
    wanted = [("netdev", netdev), ("rnic", rnic)]
    given = [(kind, _name(name)) for kind, name in wanted if name is not None]
    if not given:
        raise PnetError("a PNET ID needs a net device (-I) or an RNIC (-D)")
    entries = list(load(path))
    have = {(e.kind, e.name) for e in entries}
    new = [Entry(pid, kind, name) for kind, name in given if (kind, name) not in have]
    if not new:
        raise PnetError(f"{', '.join(n for _, n in given)} already in the PNET table", "EEXIST")
    _store(path, [*entries, *new])
    return pid


def remove(pnetid: str, path: Path | None = None) -> None:
    """Remove every entry of a PNET ID (``smc_pnet -r``, ``smc_pnet_remove_by_pnetid``):
    ``ENOENT`` if it has none."""
    path = path or path_from()
    pid = normalize(pnetid)
    entries = load(path)
    if not any(e.pnetid == pid for e in entries):
        raise PnetError(f"PNET ID {pid!r} is not set", "ENOENT")
    _store(path, [e for e in entries if e.pnetid != pid])


def flush(path: Path | None = None) -> None:
    """Remove every entry (``smc_pnet -f``)."""
    _store(path or path_from(), ())


def lookup(entries: Iterable[Entry], netdev: str | None = None,
           rnics: Iterable[str] = ()) -> str:  # fmt: skip
    """The PNET ID of an RNIC known by the names ``rnics`` and serving ``netdev``, or of
    the net device ``netdev`` alone (no ``rnics``): the RNIC's entry, else the net
    device's (module docstring); ``""`` for none."""
    entries = tuple(entries)
    names = set(rnics)
    for e in entries:
        if e.kind == "rnic" and e.name in names:
            return e.pnetid
    for e in entries:
        if e.kind == "netdev" and netdev is not None and e.name == netdev:
            return e.pnetid
    return ""


class PnetTable:
    """The host's PNET table as a process sees it, re-read when the file changes (one
    ``stat`` per call, as :class:`smcr.ueid.UeidTable`)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._key: tuple[int, int] | None = None
        self._entries: tuple[Entry, ...] = ()

    def current(self) -> tuple[Entry, ...]:
        """The entries now in force."""
        name = self.path or os.environ.get(ENV) or _DEFAULT_NAME  # (path_from, without a Path)
        key = file_key(name)
        if key is None:
            self._key, self._entries = None, ()
            return ()
        if key != self._key:
            self._key, self._entries = key, load(Path(name))
        return self._entries
