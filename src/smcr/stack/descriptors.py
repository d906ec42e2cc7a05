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
(what Python's ``select.epoll`` registers); the cost, a look at the process's
descriptors, is paid only where a number that was handed out changes its file.
"""

from __future__ import annotations

import os
import select

_FD_DIR = "/proc/self/fd"
_EPOLL_LINK = "anon_inode:[eventpoll]"


def epoll_registrations(number: int) -> list[tuple[int, int]]:
    """(epoll descriptor, events) of every epoll instance of this process that watches
    ``number``'s current file under ``number`` (user data ``number``)."""
    try:
        ino = os.fstat(number).st_ino
    except OSError:
        return []
    found = []
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return []
    for name in names:
        try:
            if os.readlink(f"{_FD_DIR}/{name}") != _EPOLL_LINK:
                continue
            with open(f"/proc/self/fdinfo/{name}", encoding="ascii") as info:
                lines = info.read().splitlines()
        except OSError:
            continue
        for line in lines:
            # tfd: %8d events: %8x data: %16llx  pos:%lli ino:%lx sdev:%x
            fields = line.split()
            if len(fields) < 8 or fields[0] != "tfd:" or int(fields[1]) != number:
                continue
            # (data: Python's epoll sets the union's 32-bit fd; the rest is whatever was there)
            data = int(fields[5], 16) & 0xFFFFFFFF
            if data == number and int(fields[7].partition(":")[2], 16) == ino:
                found.append((int(name), int(fields[3], 16)))
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
