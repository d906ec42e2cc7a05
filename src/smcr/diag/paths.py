"""Where the diag endpoints and the counters of exited processes live.

Design (the why of each):

* **One private directory per user**, beside the shm RNIC's rendezvous
  (:func:`smcr.rdma.shm.rendezvous.default_directory`): ``/run/smcr/diag`` for
  root, ``$XDG_RUNTIME_DIR/smcr/diag`` (``/run/user/<uid>/smcr/diag``) for a
  user, or ``<tmp>/smcr-<uid>/diag`` where there is no runtime directory.  Each
  level is created 0700 and refused when it is a symlink, another user's or open
  to others: nobody can pre-create a path of ours (smc-tools' stats cache in a
  shared temporary directory was a local denial of service).
* **A filesystem path, not an abstract socket**: abstract unix sockets belong to
  a network namespace, a path reaches processes in every namespace of the host.
* **One socket per process, named by pid** (``<pid>.sock``); the final counters
  of a process that exited are ``exited/<pid>-<token>.json``, the baseline of
  ``smcr stats reset`` is ``baseline.json``: all in the user's own directory,
  written by rename of a file made 0600 in the same directory.
* ``SMCR_DIAG_DIR`` replaces the directory (tests, which share the host with
  other people's smcr processes); ``SMCR_DIAG=0`` turns the endpoint off.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

SOCKET_SUFFIX = ".sock"
EXITED = "exited"
BASELINE = "baseline.json"


class UnsafeDirectoryError(OSError):
    """A directory on the way is not private to us (symlink, other owner, open mode)."""


def enabled() -> bool:
    """Whether this process answers the tools (``SMCR_DIAG`` is not ``0``)."""
    return os.environ.get("SMCR_DIAG", "1") not in ("0", "off", "no")


def user_base(uid: int | None = None) -> Path:
    """The smcr runtime directory of ``uid`` (default: ours), as the shm RNIC's."""
    uid = os.getuid() if uid is None else uid
    if uid == 0:
        return Path("/run/smcr")
    xdg = os.environ.get("XDG_RUNTIME_DIR") if uid == os.getuid() else None
    if xdg:
        return Path(xdg) / "smcr"
    run_user = Path(f"/run/user/{uid}")
    if run_user.is_dir():
        return run_user / "smcr"
    return Path(tempfile.gettempdir()) / f"smcr-{uid}"


def own_directory() -> Path:
    """This process's diag directory (``SMCR_DIAG_DIR`` or ``<user base>/diag``)."""
    if env := os.environ.get("SMCR_DIAG_DIR"):
        return Path(env)
    return user_base() / "diag"


def check_private(path: Path, uid: int | None = None) -> None:
    """Refuse ``path`` unless it is a real directory of ``uid`` closed to group and others.

    :raises UnsafeDirectoryError: otherwise (EPERM).
    """
    uid = os.getuid() if uid is None else uid
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise UnsafeDirectoryError(errno.EPERM, f"{path} is not a private directory of uid {uid}")


def ensure_private(path: Path) -> Path:
    """Create ``path`` (and its parent) 0700 where missing, then check both are ours alone.

    ``SMCR_DIAG_DIR`` is taken as given (the tests make it; only its owner is checked).
    """
    if os.environ.get("SMCR_DIAG_DIR") and path == own_directory():
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700, parents=True)
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise UnsafeDirectoryError(errno.EPERM, f"{path} is not a directory of ours")
        return path
    for level in (path.parent, path):
        with contextlib.suppress(FileExistsError):
            level.mkdir(mode=0o700)
        check_private(level)
    return path


def socket_path(directory: Path, pid: int) -> Path:
    """The endpoint of process ``pid`` in ``directory``."""
    return directory / f"{pid}{SOCKET_SUFFIX}"


def visible_directories() -> list[tuple[Path, int]]:
    """The diag directories this user may read, with the uid that must own each.

    A user: their own.  Root: every user's (``/run/smcr``, ``/run/user/*/smcr``,
    ``<tmp>/smcr-*``), each taken only if owned by the uid its name says (a
    directory that lies about its owner is not read).
    """
    own = own_directory()
    if os.environ.get("SMCR_DIAG_DIR") or os.getuid() != 0:
        return [(own, os.getuid())]
    found: list[tuple[Path, int]] = [(own, 0)]
    candidates: list[tuple[Path, int]] = []
    with contextlib.suppress(OSError):
        for entry in Path("/run/user").iterdir():
            if entry.name.isdigit():
                candidates.append((entry / "smcr" / "diag", int(entry.name)))
    with contextlib.suppress(OSError):
        for entry in Path(tempfile.gettempdir()).glob("smcr-*"):
            suffix = entry.name.removeprefix("smcr-")
            if suffix.isdigit():
                candidates.append((entry / "diag", int(suffix)))
    for path, uid in candidates:
        try:
            check_private(path, uid)
        except OSError:
            continue
        found.append((path, uid))
    return found
