"""Putting another file under a descriptor number a program already holds.

Why: an SMC socket's ``fileno()`` is one number for the socket's whole life, as a
TCP socket's is -- event loops register it before ``connect``/``listen`` and look
it up again by number afterwards.  What that number must name changes, though:
the TCP socket before ``connect``, smcr's readiness descriptor while the
handshake runs and in SMC-R mode, the TCP socket again after a fallback.  So the
socket layer moves files under the number with ``dup2``.

``select`` and ``poll`` watch numbers and follow the move by themselves.  An
``epoll`` instance watches (file, number) pairs: its registration would stay with
the old file, and ``epoll_ctl(MOD)`` of the number would then fail with
``ENOENT``.  :func:`put_at` therefore carries the process's epoll registrations of
the number over to the new file (found in ``/proc/self/fdinfo``): removed from
the old file before the move, added for the new one after it, with the same
events.  Only registrations whose user data is the number itself are carried
(what Python's ``select.epoll`` registers).  The cost, a look at each of the process's
descriptors to find its epoll instances (:func:`epoll_fds`: in C, a system call each),
is paid only where a number that was handed out changes its file; an instance's own list
of registrations is read only where the kernel says it watches the file.
"""

from __future__ import annotations

import importlib
import os
import re
import select
import stat
from types import ModuleType

_FD_DIR = "/proc/self/fd"
_EPOLL_LINK = "anon_inode:[eventpoll]"


def _c_epolls() -> ModuleType | None:
    """The C calls (:mod:`smcr.stack._epolls`), built with the compiled modules; None in a
    pure-Python process."""
    try:
        return importlib.import_module("smcr.stack._epolls")
    except ImportError:
        return None


C_EPOLLS: ModuleType | None = _c_epolls()
""":func:`_c_epolls`; tests set it to None to run the Python's look in a compiled process."""


def epoll_fds() -> list[int]:
    """This process's descriptors that name epoll instances ([] where ``/proc`` cannot
    tell).  In C where the build has it (a system call a descriptor); else each descriptor
    ``/proc/self/fd`` lists is looked at with ``fstat`` (an epoll's file is an anonymous
    inode: no file type in its mode), and only anonymous ones with ``readlink``."""
    calls = C_EPOLLS
    if calls is not None:
        try:
            fds: list[int] = calls.epoll_fds()
        except OSError:
            return []
        return fds
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return []
    found = []
    for name in names:
        try:
            fd = int(name)
            if stat.S_IFMT(os.fstat(fd).st_mode) == 0 and (
                    os.readlink(f"{_FD_DIR}/{name}") == _EPOLL_LINK):  # fmt: skip
                found.append(fd)
        except (OSError, ValueError):
            continue
    return found


def _registered(epfd: int, number: int, ino: int) -> int | None:
    """The events the epoll instance ``epfd`` watches ``number`` for, where it watches the
    file of inode ``ino`` under it with user data ``number``, from its ``fdinfo`` (a line
    per registration: ``tfd: %8d events: %8x data: %16llx  pos:%lli ino:%lx sdev:%x``);
    None where it does not."""
    try:
        with open(f"/proc/self/fdinfo/{epfd}", encoding="ascii") as info:
            text = info.read()
    except OSError:
        return None
    for match in re.finditer(
            rf"^tfd: +{number} events: +([0-9a-f]+) data: +([0-9a-f]+) .*?ino:([0-9a-f]+)",
            text, re.MULTILINE):  # fmt: skip
        # (data: Python's epoll sets the union's 32-bit fd; the rest is whatever was there)
        data = int(match[2], 16) & 0xFFFFFFFF
        if data == number and int(match[3], 16) == ino:
            return int(match[1], 16)
    return None


def epoll_registrations(number: int) -> list[tuple[int, int]]:
    """(epoll descriptor, events) of every epoll instance of this process that watches
    ``number``'s current file under ``number`` (user data ``number``).  An instance's
    registrations are read only where the kernel says it watches the file, or cannot say
    (:func:`smcr.stack._epolls.watches`: 1, 0, or -1; without the C calls, never asked):
    an event loop's instance has one per connection."""
    try:
        ino = os.fstat(number).st_ino
    except OSError:
        return []
    calls = C_EPOLLS
    found = []
    for epfd in epoll_fds():
        if calls is not None and calls.watches(epfd, number) == 0:
            continue
        events = _registered(epfd, number, ino)
        if events is not None:
            found.append((epfd, events))
    return found


def put_at(number: int, source: int) -> None:
    """Make ``number`` name ``source``'s file (``dup2``, close-on-exec as Python's
    descriptors), with the process's epoll registrations of ``number`` moved along
    (module docstring)."""
    moved: list[tuple[select.epoll, int]] = []
    for epfd, events in epoll_registrations(number):
        ep = select.epoll.fromfd(os.dup(epfd))  # the same instance; closing it closes the dup
        try:
            ep.unregister(number)
        except OSError:
            ep.close()
            continue
        moved.append((ep, events))
    try:
        os.dup2(source, number, inheritable=False)
    finally:
        for ep, events in moved:
            try:
                ep.register(number, events)
            except OSError:
                pass
            ep.close()
