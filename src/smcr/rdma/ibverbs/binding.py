"""rdma-core's Python bindings (pyverbs), imported when a verbs RNIC is first opened.

Why lazily: most hosts have no RDMA device and no pyverbs, and smcr must run there as
before; importing this package costs nothing, and the reason a verbs RNIC cannot be
opened is one line (:func:`missing`).

Versions: rdma-core 44 (Debian 12's ``python3-pyverbs``) names its enums module
``pyverbs.enums``; later releases (the PyPI ``pyverbs`` wheels, 59) call it
``pyverbs.libibverbs_enums`` and keep the old name only in some builds.  Both are taken.

Why the descriptors are found by looking at ``/proc/self/fd``: pyverbs (44 to 59) does not
give the descriptor of a completion channel or of a device's asynchronous events, and
smcr must sleep on them (``select``/``epoll`` beside its own descriptors: a wait that
costs no CPU, and no call that blocks holding the GIL, as pyverbs' ``get_cq_event``
does).  Both are ``anon_inode:[infinibandevent]`` descriptors that the object's
creation opens, and :func:`opening` notes which ones appear while it runs (under a lock:
smcr opens them nowhere else).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import os
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

EVENT_FD_LINK = "anon_inode:[infinibandevent]"
_lock = threading.Lock()
_cache: dict[str, SimpleNamespace | str] = {}
"""``"pyverbs"``: the modules once imported, or why they could not be."""


def load() -> Any:
    """pyverbs' modules (``device``, ``pd``, ``mr``, ``cq``, ``qp``, ``wr``, ``addr``,
    ``enums``, ``error``) in one namespace.

    :raises ImportError: with the reason when pyverbs cannot be imported.
    """
    known = _cache.get("pyverbs")
    if isinstance(known, SimpleNamespace):
        return known
    if known is not None:
        raise ImportError(known)
    try:
        mods = {name: importlib.import_module(f"pyverbs.{name}")
                for name in ("device", "pd", "mr", "cq", "qp", "wr", "addr")}  # fmt: skip
        mods["error"] = importlib.import_module("pyverbs.pyverbs_error")
        for enums in ("pyverbs.libibverbs_enums", "pyverbs.enums"):
            try:
                mods["enums"] = importlib.import_module(enums)
                break
            except ImportError:
                continue
        else:
            raise ImportError("pyverbs has no enums module")
    except ImportError as exc:
        reason = f"pyverbs (rdma-core's Python bindings) cannot be imported: {exc}"
        _cache["pyverbs"] = reason
        raise ImportError(reason) from exc
    loaded = _cache["pyverbs"] = SimpleNamespace(**mods)
    return loaded


def missing() -> str | None:
    """Why pyverbs cannot be used here, or None when it can."""
    try:
        load()
    except ImportError as exc:
        return str(exc)
    return None


def _event_fds() -> set[int]:
    found: set[int] = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == EVENT_FD_LINK:
                found.add(int(name))
        except OSError:
            continue
    return found


@contextlib.contextmanager
def opening() -> Iterator[list[int]]:
    """Run the creation of a verbs object; the list it yields then holds the event
    descriptors the creation opened (module docstring), each made non-blocking, so that
    a read of one that another thread emptied first fails with ``EAGAIN`` instead of
    blocking with the GIL held."""
    with _lock:
        before = _event_fds()
        opened: list[int] = []
        yield opened
        opened.extend(sorted(_event_fds() - before))
        for fd in opened:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)


def errno_of(exc: BaseException) -> int:
    """The errno a pyverbs error carries (``error_code``), else EIO."""
    code = getattr(exc, "error_code", 0)
    return int(code) if isinstance(code, int) and code > 0 else 5
